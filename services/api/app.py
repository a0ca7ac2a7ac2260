"""The API's app factory and entry point (aiohttp, following the aiohttp-demos layout)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from services.api.keys import DOWNLOAD_SLOTS, MONITOR, POOL, S3, SETTINGS, VERIFIER
from services.api.middlewares import auth_middleware, error_middleware, metrics_middleware
from services.api.routes import setup_routes
from shared.auth import TokenVerifier
from shared.db import create_pool
from shared.logs import configure_logging
from shared.monitoring import Monitor, database_check, serving, storage_check
from shared.settings import Settings
from shared.storage import s3_client

log = logging.getLogger(__name__)


async def _pg_context(app: web.Application) -> AsyncIterator[None]:
    app[POOL] = await create_pool(app[SETTINGS])
    app[MONITOR].checks["database"] = database_check(app[POOL])
    yield
    await app[POOL].close()


async def _s3_context(app: web.Application) -> AsyncIterator[None]:
    # The API only reads results that workers wrote, so it neither creates the bucket nor needs S3 up to
    # start: a download while S3 is unreachable is a 5xx problem, not a dead API. Readiness still reports
    # S3, so that an orchestrator sees a replica that cannot serve downloads.
    async with s3_client(app[SETTINGS]) as client:
        app[S3] = client
        app[MONITOR].checks["storage"] = storage_check(client, app[SETTINGS].s3_bucket)
        yield


async def _monitoring_context(app: web.Application) -> AsyncIterator[None]:
    async with serving(app[MONITOR], app[SETTINGS]):
        yield


def init_app(settings: Settings) -> web.Application:
    """Build the API application; Postgres, S3 and the monitoring endpoint (``metrics_port``) are opened
    on start-up and closed on cleanup.
    """
    # The largest per-route limit; each route enforces its own, smaller one while streaming (PITFALLS).
    app = web.Application(
        middlewares=[metrics_middleware, error_middleware, auth_middleware],
        client_max_size=settings.import_request_max_bytes,
    )
    app[SETTINGS] = settings
    app[VERIFIER] = TokenVerifier(settings)
    app[DOWNLOAD_SLOTS] = asyncio.Semaphore(settings.download_concurrency)
    app[MONITOR] = Monitor("api", needs=("database", "storage"))
    app.cleanup_ctx.append(_pg_context)
    app.cleanup_ctx.append(_s3_context)
    app.cleanup_ctx.append(_monitoring_context)
    setup_routes(app)
    return app


def main(settings: Settings) -> None:
    """Serve on ``api_host:api_port`` until SIGINT/SIGTERM; in-flight requests get the grace period."""
    configure_logging(settings, service="api")
    app = init_app(settings)
    log.info("api starting", extra={"host": settings.api_host, "port": settings.api_port})
    web.run_app(
        app,
        host=settings.api_host,
        port=settings.api_port,
        shutdown_timeout=settings.shutdown_grace_seconds,
        print=None,
        access_log=None,
    )
