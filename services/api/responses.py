"""JSON success responses: UTF-8 text as is, so the read API prints a body exactly as the export file does."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web


def dumps(body: Any) -> str:
    """Serialise ``body`` as JSON without escaping non-ASCII characters."""
    return json.dumps(body, ensure_ascii=False)


def json_response(body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """A ``200`` (or ``status``) ``application/json`` response of ``body``."""
    return web.json_response(body, status=status, headers=headers, dumps=dumps)
