"""``GET /v3/openapi.json``: the API's OpenAPI document (``services.api.openapi`` builds it; the application
holds it under ``OPENAPI_DOCUMENT``).
"""

from __future__ import annotations

from aiohttp import web

from services.api.http.bodies import JSON_MEDIA_TYPE
from services.api.http.contract import Answer, Endpoint
from services.api.http.keys import OPENAPI_DOCUMENT


async def openapi_document(request: web.Request) -> web.Response:
    """``GET /v3/openapi.json``, readable without a token; cacheable, since it changes only with a deploy."""
    return web.Response(body=request.app[OPENAPI_DOCUMENT], content_type="application/json", charset="utf-8")


ENDPOINTS = (
    Endpoint(
        route="getOpenApiDocument",
        handler=openapi_document,
        summary="The OpenAPI 3.1 document of the /v2 and /v3 routes",
        tag="meta",
        answers=(Answer(200, "OpenAPI 3.1.", content={JSON_MEDIA_TYPE: {"schema": {"type": "object"}}}),),
    ),
)
