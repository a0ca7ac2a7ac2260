"""Liveness and readiness on the API's own port too, for load balancers that probe the serving port;
the same answers as the monitoring endpoint's (``shared.monitoring``).
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from services.api.http.keys import MONITOR
from shared.monitoring import healthz

__all__ = ["healthz", "readyz"]


async def readyz(request: web.Request) -> web.Response:
    """``GET /readyz``: 200 when Postgres and S3 answer in time, else 503 problem+json (docs/architecture.md: How it
    works)."""
    return await request.app[MONITOR].ready_response()


# Route name (shared.routes) -> handler, for the route table (services.api.routes).
HANDLERS: dict[str, Handler] = {"healthz": healthz, "readyz": readyz}
