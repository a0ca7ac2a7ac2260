"""The janitor's entry point: one leader at a time runs a pass every ``janitor_interval_seconds``."""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from services.janitor import repository as repo
from services.janitor.janitor import Janitor
from shared.db import TRANSIENT_DATABASE_ERRORS, create_pool_when_ready
from shared.lifecycle import run_until_signalled, sleep_unless_stopped
from shared.logs import configure_logging
from shared.settings import Settings
from shared.storage import s3_client

log = logging.getLogger(__name__)


async def serve(settings: Settings, *, stop: asyncio.Event) -> None:
    """Run passes until ``stop`` is set. Only the holder of the leader lock acts (Postgres advisory lock
    held by a dedicated connection); a failed pass is logged and the next one tries again.
    """
    pool = await create_pool_when_ready(settings, stop=stop)
    leader: asyncpg.Connection | None = None
    try:
        async with s3_client(settings) as s3:
            janitor = Janitor(pool=pool, s3=s3, settings=settings)
            while not stop.is_set():
                leader = await _lead(settings, leader)
                if leader is not None:
                    await _pass(janitor)
                await sleep_unless_stopped(stop, settings.janitor_interval_seconds)
    finally:
        if leader is not None and not leader.is_closed():
            await leader.close()
        await pool.close()


async def _lead(settings: Settings, leader: asyncpg.Connection | None) -> asyncpg.Connection | None:
    """Return the connection holding the leader lock, taking it if free; None when another janitor leads."""
    if leader is not None and not leader.is_closed():
        return leader
    try:
        conn = await asyncpg.connect(settings.database_url, timeout=settings.database_timeout_seconds)
    except TRANSIENT_DATABASE_ERRORS:
        log.warning("database unavailable; janitor waits")
        return None
    if await repo.try_lead(conn):
        log.info("janitor leads")
        return conn
    await conn.close()
    return None


async def _pass(janitor: Janitor) -> None:
    try:
        await janitor.run_pass()
    except TRANSIENT_DATABASE_ERRORS as exc:
        log.warning("janitor pass failed; next pass retries", extra={"error": type(exc).__name__})


def main(settings: Settings) -> None:
    """Run the janitor until SIGINT or SIGTERM."""
    configure_logging(settings, service="janitor")
    asyncio.run(run_until_signalled(serve, settings))
