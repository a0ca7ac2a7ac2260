"""The API's app factory and entry point (aiohttp, following the aiohttp-demos layout)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from services.api.exporting.changes import CHANGES, OperationChanges
from services.api.http.keys import (
    DOWNLOAD_SLOTS,
    LIMITER,
    MONITOR,
    PARTITION_KEYS,
    POLICIES,
    POOL,
    PRESIGNER,
    S3,
    SETTINGS,
    UPLOAD_SLOTS,
    VERIFIER,
    WAIT_SLOTS,
)
from services.api.http.middlewares import add_rate_limit_fields, request_middleware
from services.api.http.server import api_runner
from services.api.http.slots import ConnectionSlots
from services.api.limiting.limiter import RateLimiter
from services.api.limiting.policies import PartitionKeys, policies
from services.api.routes import setup_routes
from shared import tracing
from shared.auth import TokenVerifier
from shared.db import TRANSIENT_DATABASE_ERRORS, create_pool
from shared.jwks import RemoteKeys
from shared.lifecycle import listening_site, run_until_signalled, started
from shared.logs import configure_logging
from shared.migrator import require_schema
from shared.monitoring import Monitor, database_check, serving, storage_check
from shared.rate_policies import PolicyName
from shared.settings import ApiPartSettings
from shared.storage import open_presigner, open_s3_client

log = logging.getLogger(__name__)


# What each kind of slot holds, the problem code of a refusal at one user's cap, and that cap as a policy.
SLOT_WORDS = {
    "download": ("downloads", "TOO_MANY_DOWNLOADS", PolicyName.OPEN_DOWNLOADS),
    "wait": ("waiting requests", "TOO_MANY_WAITERS", PolicyName.OPEN_WAITERS),
    "upload": ("uploads", "TOO_MANY_UPLOADS", PolicyName.OPEN_UPLOADS),
}


async def _pg_context(app: web.Application) -> AsyncIterator[None]:
    # No connection at start-up: an api started while the database is down (restarted with it, say) serves
    # 503 problems and is not ready until it is back, rather than dying.
    # The API acknowledges its commits to clients: one held on the primary only must answer 503, not 2xx.
    app[POOL] = await create_pool(app[SETTINGS], min_size=0, refuse_unreplicated=True)
    app[MONITOR].checks["database"] = database_check(app[POOL])
    # A database that is down is not a refusal: readiness reports the schema once it is back.
    with contextlib.suppress(*TRANSIENT_DATABASE_ERRORS):
        await require_schema(app[POOL])
    yield
    await app[POOL].close()


async def _s3_context(app: web.Application) -> AsyncIterator[None]:
    # The API only reads results that workers wrote, so it neither creates the bucket nor needs S3 up to
    # start: a download while S3 is unreachable is a 5xx problem, not a dead API. Readiness still reports
    # S3, so that an orchestrator sees a replica that cannot serve downloads.
    async with (
        open_s3_client(app[SETTINGS], held=app[SETTINGS].download_concurrency) as client,
        open_presigner(app[SETTINGS]) as presigner,
    ):
        app[S3] = client
        app[PRESIGNER] = presigner
        app[MONITOR].checks["storage"] = storage_check(client, app[SETTINGS].s3_bucket)
        yield


async def _limiter_context(app: web.Application) -> AsyncIterator[None]:
    await app[LIMITER].start()
    yield
    await app[LIMITER].close()


async def _changes_context(app: web.Application) -> AsyncIterator[None]:
    app[CHANGES] = OperationChanges(app[SETTINGS])
    await app[CHANGES].start()
    yield
    await app[CHANGES].close()


async def _release_waiters(app: web.Application) -> None:
    # On shutdown, before in-flight requests get their grace: long polls answer and event streams end now.
    await app[CHANGES].close()


async def _keys_context(app: web.Application) -> AsyncIterator[None]:
    # Keys fetched from the identity provider are loaded and refreshed in the background; until the first
    # set is in, tokens are refused and readiness says so (docs/keys.md: Connect your identity provider).
    keys = app[VERIFIER].keys
    if not isinstance(keys, RemoteKeys):
        app[MONITOR].checks["keys"] = _static_keys
        yield
        return
    app[MONITOR].checks["keys"] = keys.check
    refreshing = asyncio.create_task(keys.run(), name="jwks-refresh")
    yield
    refreshing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await refreshing


async def _static_keys() -> None:
    """Static keys are ready from the start."""


async def _monitoring_context(app: web.Application) -> AsyncIterator[None]:
    async with serving(app[MONITOR], app[SETTINGS]):
        yield


def init_app(settings: ApiPartSettings) -> web.Application:
    """Build the API application; Postgres, S3 and the monitoring endpoint (``metrics_port``) are opened
    on start-up and closed on cleanup.
    """
    # The largest per-route limit; each route enforces its own, smaller one while streaming.
    app = web.Application(
        middlewares=[request_middleware],
        client_max_size=settings.import_request_max_bytes,
    )
    app[SETTINGS] = settings
    app[VERIFIER] = TokenVerifier(settings)
    app[POLICIES] = policies(settings)
    app[LIMITER] = RateLimiter(settings)
    app[PARTITION_KEYS] = PartitionKeys(settings)
    # (total, name) of each kind of long connection a process caps; the per-user cap is the slot's policy
    # (docs/api.md: Downloads; Message store, Attachments; Rate limits).
    caps = {
        DOWNLOAD_SLOTS: (settings.download_concurrency, "download"),
        WAIT_SLOTS: (settings.wait_concurrency, "wait"),
        UPLOAD_SLOTS: (settings.upload_concurrency, "upload"),
    }
    for key, (total, name) in caps.items():
        what, code, policy = SLOT_WORDS[name]
        app[key] = ConnectionSlots(total=total, policy=app[POLICIES][policy], name=name, what=what, code=code)
    app.on_response_prepare.append(add_rate_limit_fields)
    app[MONITOR] = Monitor("api", needs=("database", "storage", "keys"))
    app.cleanup_ctx.append(_keys_context)
    app.cleanup_ctx.append(_pg_context)
    app.cleanup_ctx.append(_limiter_context)
    app.cleanup_ctx.append(_changes_context)
    app.on_shutdown.append(_release_waiters)
    app.cleanup_ctx.append(_s3_context)
    app.cleanup_ctx.append(_monitoring_context)
    setup_routes(app)
    return app


@contextlib.asynccontextmanager
async def listening(settings: ApiPartSettings) -> AsyncIterator[web.AppRunner]:
    """Serve the API on ``api_host:api_port`` (or the inherited ``api_socket_fd``) for the duration of the
    block, as ``main`` does, and yield its runner (``runner.addresses`` names the bound sockets: port 0 picks a
    free one). On exit the listener closes, in-flight requests get ``shutdown_grace_seconds`` to finish and the
    application is cleaned up.
    """
    runner = api_runner(init_app(settings), settings)
    await runner.setup()
    try:
        await listening_site(runner, settings.api_host, settings.api_port, settings.api_socket_fd).start()
        yield runner
    finally:
        await runner.cleanup()


async def serve(settings: ApiPartSettings, *, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set, then drain as ``listening`` does."""
    async with listening(settings):
        started()
        await stop.wait()


def main(settings: ApiPartSettings) -> None:
    """Serve on ``api_host:api_port`` until SIGINT/SIGTERM; in-flight requests get the grace period."""
    configure_logging(settings, service="api")
    log.info("api starting", extra={"host": settings.api_host, "port": settings.api_port})
    with tracing.traced("api", edge=True):
        asyncio.run(run_until_signalled(serve, settings))
