"""The janitor's entry point: one leader at a time runs a pass every ``janitor_interval_seconds``."""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from services.janitor import leadership, metrics
from services.janitor.janitor import Janitor
from shared.db import TRANSIENT_DATABASE_ERRORS, connect, create_pool_when_ready
from shared.lifecycle import run_until_signalled, sleep_unless_stopped
from shared.logs import configure_logging
from shared.monitoring import Monitor, database_check, serving, storage_check
from shared.settings import Settings
from shared.storage import open_s3_client

log = logging.getLogger(__name__)

# A leader silent for this many intervals (and at least this long) is taken for gone and loses the lock.
LEADER_IDLE_PASSES = 4
LEADER_IDLE_MIN_SECONDS = 10.0


async def serve(settings: Settings, *, stop: asyncio.Event) -> None:
    """Run passes until ``stop`` is set. Only the holder of the leader lock acts (Postgres advisory lock
    held by a dedicated connection); a failed pass is logged and the next one tries again.

    Every janitor, leader or standby, serves the system gauges (operations by state, outbox backlog),
    read from Postgres at each scrape.
    """
    monitor = Monitor("janitor", needs=("database", "storage"))
    async with serving(monitor, settings):
        pool = await create_pool_when_ready(settings, stop=stop)
        monitor.checks["database"] = database_check(pool)
        monitor.before_scrape.append(lambda: metrics.observe_system(pool))
        await _run(settings, pool, monitor, stop=stop)


async def _run(settings: Settings, pool: asyncpg.Pool, monitor: Monitor, *, stop: asyncio.Event) -> None:
    leader: asyncpg.Connection | None = None
    try:
        async with open_s3_client(settings) as s3:
            monitor.checks["storage"] = storage_check(s3, settings.s3_bucket)
            janitor = Janitor(pool=pool, s3=s3, settings=settings)
            while not stop.is_set():
                leader = await _lead(settings, leader)
                metrics.LEADER.set(1 if leader is not None else 0)
                if leader is not None:
                    await _pass(janitor)
                await sleep_unless_stopped(stop, settings.janitor_interval_seconds)
    finally:
        metrics.LEADER.set(0)
        if leader is not None and not leader.is_closed():
            await leader.close()
        await pool.close()


async def _lead(settings: Settings, leader: asyncpg.Connection | None) -> asyncpg.Connection | None:
    """Return the connection holding the leader lock, taking it if free; None when another janitor leads.

    The lock lasts as long as its session, and the server ends a session idle for ``_leader_idle_ms``: a
    live leader touches it before every pass, so only a leader that stopped answering (frozen, or its host
    gone without closing the connection) loses the lock to another janitor.
    """
    if leader is not None:
        if not leader.is_closed():
            try:
                await leadership.still_leading(leader)
                return leader
            except TRANSIENT_DATABASE_ERRORS:
                leader.terminate()
        # Ended by the server (idle past _leader_idle_ms, a pass that outlasted it) or by the network.
        log.warning("leader session lost; janitor tries to lead again")
    conn: asyncpg.Connection | None = None
    try:
        conn = await connect(settings, idle_session_timeout=str(_leader_idle_ms(settings)))
        # The new session may be ended before it asks for the lock (a restart, an operator, the idle
        # timeout of a process that was frozen): that is the database being unavailable, not a crash.
        if await leadership.try_lead(conn):
            log.info("janitor leads")
            return conn
        await conn.close()
    except TRANSIENT_DATABASE_ERRORS:
        log.warning("database unavailable; janitor waits")
        if conn is not None:
            conn.terminate()
    return None


def _leader_idle_ms(settings: Settings) -> int:
    """How long the leader's session may stay idle: ``LEADER_IDLE_PASSES`` intervals, at least
    ``LEADER_IDLE_MIN_SECONDS``; in milliseconds, as Postgres takes it.
    """
    seconds = max(LEADER_IDLE_PASSES * settings.janitor_interval_seconds, LEADER_IDLE_MIN_SECONDS)
    return int(seconds * 1000)


async def _pass(janitor: Janitor) -> None:
    try:
        await janitor.run_pass()
    except TRANSIENT_DATABASE_ERRORS as exc:
        log.warning("janitor pass failed; next pass retries", extra={"error": type(exc).__name__})


def main(settings: Settings) -> None:
    """Run the janitor until SIGINT or SIGTERM."""
    configure_logging(settings, service="janitor")
    asyncio.run(run_until_signalled(serve, settings))
