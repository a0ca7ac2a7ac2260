"""The janitor's entry point: one leader at a time runs a pass every ``janitor_interval_seconds`` and fires the
due schedules every ``scheduler_interval_seconds``.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from services.janitor import leadership, metrics
from services.janitor.janitor import Janitor
from services.janitor.scheduler import Scheduler
from shared import tracing
from shared.db import TRANSIENT_DATABASE_ERRORS, close_connection, connect
from shared.lifecycle import run_until_signalled, sleep_unless_stopped, started
from shared.logs import configure_logging
from shared.monitoring import Monitor, serving_with_database, storage_check
from shared.settings import JanitorPartSettings
from shared.storage import open_s3_client

log = logging.getLogger(__name__)

# A leader silent for this many intervals (and at least this long) is taken for gone and loses the lock.
LEADER_IDLE_PASSES = 4
LEADER_IDLE_MIN_SECONDS = 10.0


async def serve(settings: JanitorPartSettings, *, stop: asyncio.Event) -> None:
    """Run passes and the scheduler until ``stop`` is set. Only the holder of the leader lock acts (Postgres
    advisory lock held by a dedicated connection); a failed pass or round is logged and the next one tries again.

    Every janitor, leader or standby, serves the system gauges (operations by state, outbox backlog, schedules
    by state), read from Postgres at each scrape.
    """
    monitor = Monitor("janitor", needs=("database", "storage"))
    async with serving_with_database(monitor, settings, stop=stop) as pool:
        monitor.before_scrape.append(lambda: metrics.observe_system(pool))
        await _run(settings, pool, monitor, stop=stop)


async def _run(settings: JanitorPartSettings, pool: asyncpg.Pool, monitor: Monitor, *, stop: asyncio.Event) -> None:
    session = LeaderSession(settings)
    try:
        async with open_s3_client(settings) as s3:
            monitor.checks["storage"] = storage_check(s3, settings.s3_bucket)
            janitor = Janitor(pool=pool, s3=s3, settings=settings)
            started()
            # The passes every janitor_interval_seconds, the scheduler every scheduler_interval_seconds, both
            # under one leader lock; each finishes what it does (a pass, a fire) when ``stop`` is set.
            async with asyncio.TaskGroup() as group:
                group.create_task(_run_passes(janitor, session, settings, stop=stop), name="janitor-passes")
                scheduler = Scheduler(pool=pool, settings=settings)
                group.create_task(_run_scheduler(scheduler, session, settings, stop=stop), name="scheduler")
    finally:
        await session.close()
        await pool.close()


async def _run_passes(
    janitor: Janitor, session: LeaderSession, settings: JanitorPartSettings, *, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        if await session.lead():
            await _pass(janitor)
        await sleep_unless_stopped(stop, settings.janitor_interval_seconds)


async def _run_scheduler(
    scheduler: Scheduler, session: LeaderSession, settings: JanitorPartSettings, *, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        if await session.confirm():
            await _round(scheduler, stop=stop)
        await sleep_unless_stopped(stop, settings.scheduler_interval_seconds)


class LeaderSession:
    """The session holding the janitor's leader lock, shared by the passes and the scheduler, which use it one
    statement at a time. The passes take the lock when it is free (``lead``); the scheduler only confirms it
    (``confirm``), so a standby asks for the lock at the passes' pace, not at every round of the scheduler.
    """

    def __init__(self, settings: JanitorPartSettings) -> None:
        self._settings = settings
        self._session: asyncpg.Connection | None = None
        self._turn = asyncio.Lock()

    async def lead(self) -> bool:
        """Whether this janitor leads, taking the lock if it is free (``_lead``)."""
        async with self._turn:
            self._session = await _lead(self._settings, self._session)
            return self._leading()

    async def confirm(self) -> bool:
        """Whether this janitor still leads: its session holds the lock on a server that takes writes. A
        session found gone is dropped, and the passes try to lead again at their next turn.
        """
        async with self._turn:
            if self._session is not None:
                self._session = await _kept(self._session)
            return self._leading()

    async def close(self) -> None:
        """End the session, and the lock with it."""
        async with self._turn:
            if self._session is not None:
                await close_connection(self._session)
                self._session = None
            self._leading()

    def _leading(self) -> bool:
        metrics.LEADER.set(1 if self._session is not None else 0)
        return self._session is not None


async def _lead(settings: JanitorPartSettings, leader: asyncpg.Connection | None) -> asyncpg.Connection | None:
    """Return the connection holding the leader lock, taking it if free; None when another janitor leads.

    The lock lasts as long as its session, and the server ends a session idle for ``_leader_idle_ms``: a
    live leader touches it before every pass and every round of the scheduler, so only a leader that stopped
    answering (frozen, or its host gone without closing the connection) loses the lock to another janitor.
    The touch is a short transaction (``leadership.still_leading``), and a leader frozen inside it leaves the
    session idle in a transaction, which ``idle_session_timeout`` does not count: the same limit is set for
    that state too.
    """
    if leader is not None and (kept := await _kept(leader)) is not None:
        return kept
    conn: asyncpg.Connection | None = None
    try:
        idle_ms = str(_leader_idle_ms(settings))
        conn = await connect(settings, idle_session_timeout=idle_ms, idle_in_transaction_session_timeout=idle_ms)
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


async def _kept(leader: asyncpg.Connection) -> asyncpg.Connection | None:
    """``leader`` while its session still holds the lock on a server that takes writes; else None, the
    session ended.
    """
    if not leader.is_closed():
        try:
            await leadership.still_leading(leader)
            return leader
        except TRANSIENT_DATABASE_ERRORS:
            leader.terminate()
    # Ended by the server (idle past _leader_idle_ms) or by the network, or its server no longer takes writes.
    log.warning("leader session lost; janitor tries to lead again")
    return None


def _leader_idle_ms(settings: JanitorPartSettings) -> int:
    """How long the leader's session may stay idle: ``LEADER_IDLE_PASSES`` intervals, at least
    ``LEADER_IDLE_MIN_SECONDS``; in milliseconds, as Postgres takes it.
    """
    seconds = max(LEADER_IDLE_PASSES * settings.janitor_interval_seconds, LEADER_IDLE_MIN_SECONDS)
    return int(seconds * 1000)


async def _pass(janitor: Janitor) -> None:
    try:
        # A trace of its own; the wake-ups it writes carry their operations' stored contexts
        # (docs/monitoring.md: Monitoring, Traces).
        with tracing.span("janitor pass", root=True):
            await janitor.run_pass()
    except TRANSIENT_DATABASE_ERRORS as exc:
        log.warning("janitor pass failed; next pass retries", extra={"error": type(exc).__name__})


async def _round(scheduler: Scheduler, *, stop: asyncio.Event) -> None:
    try:
        await scheduler.run_round(stop=stop)
    except TRANSIENT_DATABASE_ERRORS as exc:
        log.warning("scheduler round failed; next round retries", extra={"error": type(exc).__name__})


def main(settings: JanitorPartSettings) -> None:
    """Run the janitor until SIGINT or SIGTERM."""
    configure_logging(settings, service="janitor")
    with tracing.traced("janitor"):
        asyncio.run(run_until_signalled(serve, settings))
