"""Every part's monitoring endpoint, on its own port (``metrics_host:metrics_port``): Prometheus metrics,
liveness and readiness, for scrapers, orchestrators and ``chatexport health``.

- ``GET /metrics``: the default prometheus_client registry in the text exposition format; a part may
  refresh gauges from Postgres just before (``Monitor.before_scrape``).
- ``GET /healthz``: 200 while the process's event loop answers; checks no dependency.
- ``GET /readyz``: 200 when every dependency the part uses answers within ``CHECK_TIMEOUT_SECONDS``;
  else 503 problem+json naming the failing checks (docs/architecture.md: How it works: readiness reports not-ready while
  a part cannot reach a dependency).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import asyncpg
from aio_pika.abc import AbstractRobustConnection
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, disable_created_metrics, generate_latest

from shared.db import create_pool_when_ready, probing_connection, require_writable
from shared.lifecycle import listening_site
from shared.metrics import REFRESH_FAILURES
from shared.migrator import check_schema, require_schema
from shared.settings import MonitoringSettings, PartSettings

log = logging.getLogger(__name__)

# A ``_created`` timestamp beside every counter doubles what a scrape carries, and nothing alerts on it.
disable_created_metrics()

Check = Callable[[], Awaitable[None]]
"""A readiness check: returns when its dependency is usable, raises anything otherwise."""

# Below a typical probe timeout, so the orchestrator sees our 503 rather than its own timeout.
CHECK_TIMEOUT_SECONDS = 2.0
# A scrape waits this long for a refresh of database-backed gauges, then serves the previous values.
REFRESH_TIMEOUT_SECONDS = 2.0


class Unavailable(Exception):
    """A dependency is known to be unusable without asking it (a closed connection, no consumer)."""


class Starting(Unavailable):
    """The part has not opened this dependency yet."""


async def _starting() -> None:
    raise Starting


class Monitor:
    """A part's readiness checks and pre-scrape refreshes; ``app()`` is the aiohttp application serving them.

    ``needs`` names the checks the part will register (``database``, ``broker``, ``storage``, ...): until
    a part has opened a dependency and put its check in ``checks``, that check fails as ``Starting``.
    """

    def __init__(self, part: str, *, needs: Sequence[str]) -> None:
        self.part = part
        self.checks: dict[str, Check] = dict.fromkeys(needs, _starting)
        self.before_scrape: list[Callable[[], Awaitable[None]]] = []
        self._failing: list[str] = []

    async def readiness(self) -> dict[str, str]:
        """Run every check concurrently; return ``{name: "ok" | "<ErrorClass>"}``."""
        names = list(self.checks)
        results = await asyncio.gather(*(_run_check(self.checks[name]) for name in names))
        return dict(zip(names, results, strict=True))

    async def ready_response(self) -> web.Response:
        """200 ``{"status": "ready", "checks": {...}}``, or 503 problem+json with the same ``checks``."""
        checks = await self.readiness()
        failing = sorted(name for name, result in checks.items() if result != "ok")
        if failing != self._failing:
            # Once per change, not per probe: an orchestrator probes every few seconds.
            log.log(logging.WARNING if failing else logging.INFO, "readiness changed", extra={"checks": checks})
            self._failing = failing
        if not failing:
            return web.json_response({"status": "ready", "checks": checks})
        return _not_ready(f"Not ready: {', '.join(failing)} unavailable.", checks)

    def app(self) -> web.Application:
        """The monitoring application: ``/metrics``, ``/healthz``, ``/readyz``."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", self._readyz)
        return app

    async def _readyz(self, request: web.Request) -> web.Response:
        return await self.ready_response()

    async def _metrics(self, request: web.Request) -> web.Response:
        for refresh in self.before_scrape:
            try:
                async with asyncio.timeout(REFRESH_TIMEOUT_SECONDS):
                    await refresh()
            except Exception as exc:
                # Stale gauges beat a failed scrape: the dependency's own alerts tell what is wrong, and
                # the failure count tells the gauges are stale.
                REFRESH_FAILURES.inc()
                log.warning("metrics refresh failed", extra={"error": type(exc).__name__})
        body = generate_latest(REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: 200 while the process serves requests."""
    return web.json_response({"status": "ok"})


async def _run_check(check: Check) -> str:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
            await check()
    except Exception as exc:
        # Whatever stops a check from answering in time (refused, dropped, timed out, a driver left
        # broken by a vanished server) means the same thing: not ready.
        return type(exc).__name__
    return "ok"


def _not_ready(detail: str, checks: dict[str, str]) -> web.Response:
    """The 503 problem+json (docs/api.md: Error codes), with the checks as an extension member."""
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": "Service Unavailable",
        "status": 503,
        "detail": detail,
        "code": "SERVICE_UNAVAILABLE",
        "checks": checks,
    }
    return web.Response(
        status=503,
        text=json.dumps(body),
        content_type="application/problem+json",
        headers={"Retry-After": "5"},
    )


def database_check(pool: asyncpg.Pool) -> Check:
    """Ready when a pooled connection's server takes writes (``require_writable``) and this release runs on
    its schema (``check_schema``; docs/deploy.md: Upgrading): every part that checks its database writes to
    it, and a standby or a read-only primary answers ``SELECT 1`` all the same (docs/operations.md: A
    database that takes no writes). Raises ``ReadOnlyServer`` or ``SchemaOutOfRange``. One connection for
    both: the parts of a test run share one server's connection limit.
    """

    async def check() -> None:
        async with probing_connection(pool) as conn:
            await require_writable(conn)
            await check_schema(conn)

    return check


def broker_check(connection: AbstractRobustConnection) -> Check:
    """Ready while the robust connection to RabbitMQ is up (it reconnects by itself after a restart)."""

    async def check() -> None:
        if not connection.connected.is_set():
            raise Unavailable("broker connection down")

    return check


def storage_check(s3: Any, bucket: str) -> Check:
    """Ready when S3 answers ``HeadBucket`` for ``bucket``."""

    async def check() -> None:
        await s3.head_bucket(Bucket=bucket)

    return check


@contextlib.asynccontextmanager
async def serving_with_database(
    monitor: Monitor, settings: PartSettings, *, stop: asyncio.Event
) -> AsyncIterator[asyncpg.Pool]:
    """A part's start, written once: ``monitor`` served first (``serving``), so that an orchestrator sees a live
    but not-ready part while it waits for a dependency; then the database pool, once the database answers,
    checked on ``/readyz`` (``database_check``) and against this release's schema (``require_schema``;
    docs/deploy.md: Upgrading). Yields the pool; closes it, then the endpoint, on exit.

    Raises ``Stopped`` when ``stop`` is set while waiting, ``SchemaOutOfRange`` when the schema is outside
    this release's range, ``OSError`` when the monitoring port is taken.
    """
    async with serving(monitor, settings):
        pool = await create_pool_when_ready(settings, stop=stop)
        try:
            monitor.checks["database"] = database_check(pool)
            await require_schema(pool)
            yield pool
        finally:
            await pool.close()


@contextlib.asynccontextmanager
async def serving(monitor: Monitor, settings: MonitoringSettings) -> AsyncIterator[int]:
    """Serve ``monitor`` on ``settings.metrics_host:metrics_port`` (or the inherited ``metrics_socket_fd``)
    while inside; yield the bound port (``metrics_port`` 0 picks a free one). Raises ``OSError`` when the port
    is taken.
    """
    runner = web.AppRunner(monitor.app(), access_log=None)
    await runner.setup()
    try:
        site = listening_site(runner, settings.metrics_host, settings.metrics_port, settings.metrics_socket_fd)
        await site.start()
        port = int(runner.addresses[0][1])
        log.info("monitoring endpoint listening", extra={"part": monitor.part, "port": port})
        yield port
    finally:
        await runner.cleanup()
