"""JSON success responses: UTF-8 text as is, so the read API prints a body exactly as the export file does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from shared import jsontext


def dumps(body: Any) -> str:
    """Serialise ``body`` as JSON: non-ASCII as is, line-breaking code points escaped (``shared.jsontext``)."""
    return jsontext.dumps(body)


def json_response(body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """A ``200`` (or ``status``) ``application/json`` response of ``body``."""
    return web.json_response(body, status=status, headers=headers, dumps=dumps)
