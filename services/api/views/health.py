"""Liveness and readiness probes; unauthenticated, for orchestrators and load balancers."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from services.api.keys import POOL
from services.api.problems import Problem
from services.api.repository.health import ping
from services.api.responses import json_response

log = logging.getLogger(__name__)

# Below a typical probe timeout, so the orchestrator sees our 503 rather than its own timeout.
READY_TIMEOUT_SECONDS = 2.0


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: 200 while the process serves requests; checks no dependency."""
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """``GET /readyz``: 200 when Postgres answers within ``READY_TIMEOUT_SECONDS``, else 503 (contract 6)."""
    try:
        async with asyncio.timeout(READY_TIMEOUT_SECONDS), request.app[POOL].acquire() as conn:
            await ping(conn)
    except Exception as exc:
        # Whatever stops ``SELECT 1`` from answering (timeout, refused or dropped connection, a driver
        # left in a broken state by a terminated backend) means the same thing: not ready.
        log.warning("not ready: database unavailable", extra={"error": type(exc).__name__})
        raise Problem("SERVICE_UNAVAILABLE", "The database is not reachable; try again later.") from None
    return json_response({"status": "ready"})
