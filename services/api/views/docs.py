"""``GET /v3/openapi.json``: the OpenAPI 3.1 document of the public API, readable without a token."""

from __future__ import annotations

from aiohttp import web

from services.api.openapi import document_bytes


async def openapi_document(request: web.Request) -> web.Response:
    """The document built by ``services.api.openapi``; cacheable, since it changes only with a deploy."""
    return web.Response(body=document_bytes(), content_type="application/json", charset="utf-8")
