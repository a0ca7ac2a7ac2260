"""Where an attempt's reads go when its read URL names no usable standby (docs/deploy.md: Export reads on a hot
standby), on the real Postgres: a server that is not in recovery, one that refuses the session, and one that
has replayed past the claim without showing the claim's row under its generation (a forked standby) all send
the reads to the primary at once, and the reason is counted.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from prometheus_client import REGISTRY

from services.worker.writing.read_source import ReadSource, recovery_conflict
from shared.repository import leases
from shared.settings import Settings
from tests.support import cloned_database
from tests.support.rows import insert_operation

# Long enough that a test which waited for it would hit its own timeout instead of passing.
WAIT_SECONDS = 600.0


def fallbacks(reason: str) -> float:
    return REGISTRY.get_sample_value("chatexport_worker_standby_fallbacks_total", {"reason": reason}) or 0.0


def reads(server: str) -> float:
    return REGISTRY.get_sample_value("chatexport_worker_export_reads_total", {"server": server}) or 0.0


@pytest.fixture
async def missing_database_pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    """A pool on a database that does not exist: every session it opens is refused."""
    parts = urlsplit(settings.database_url)
    url = urlunsplit(parts._replace(path="/chatexport_no_such_database"))
    async with asyncpg.create_pool(url, min_size=0, max_size=1) as refused:
        yield refused


async def in_recovery(conn: asyncpg.Connection) -> bool:
    answer: bool = await conn.fetchval("SELECT pg_is_in_recovery()")
    return answer


async def test_a_read_url_on_a_primary_sends_the_reads_to_the_primary_at_once(pool: asyncpg.Pool) -> None:
    before, primary_before = fallbacks("not_standby"), reads("primary")
    export_reads = await ReadSource(primary=pool, standby=pool, wait_seconds=WAIT_SECONDS).begin()
    assert await export_reads.run(in_recovery) is False
    assert await export_reads.run(in_recovery) is False
    export_reads.finish()
    assert fallbacks("not_standby") == before + 1
    assert reads("primary") == primary_before + 1


async def test_a_standby_that_refuses_the_session_sends_the_reads_to_the_primary(
    pool: asyncpg.Pool, missing_database_pool: asyncpg.Pool
) -> None:
    before = fallbacks("unavailable")
    export_reads = await ReadSource(primary=pool, standby=missing_database_pool, wait_seconds=WAIT_SECONDS).begin()
    assert await export_reads.run(in_recovery) is False
    assert fallbacks("unavailable") == before + 1


# A "standby" that is an ordinary database: these functions, ahead of pg_catalog on its sessions' search path,
# make it look in recovery and replayed past any position, so that only the claim's row tells it apart.
REPLAYED_EVERYTHING_SQL = """
CREATE SCHEMA replayed;
CREATE FUNCTION replayed.pg_is_in_recovery() RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE FUNCTION replayed.pg_last_wal_replay_lsn() RETURNS pg_lsn LANGUAGE sql AS 'SELECT ''FFFFFFFF/FFFFFFFF''::pg_lsn';
"""

CLAIMED_GENERATION = 3


async def served_by(conn: asyncpg.Connection) -> str:
    name: str = await conn.fetchval("SELECT current_database()")
    return name


@pytest.mark.parametrize(
    ("standby_generation", "served_on_standby"),
    [(None, False), (CLAIMED_GENERATION - 1, False), (CLAIMED_GENERATION, True)],
    ids=["claim-missing", "other-generation", "claim-shown"],
)
async def test_a_standby_past_the_position_without_the_claim_sends_the_reads_to_the_primary(
    pool: asyncpg.Pool, template_db: str, standby_generation: int | None, served_on_standby: bool
) -> None:
    await insert_operation(pool, "op-claimed", "RUNNING", generation=CLAIMED_GENERATION)
    async with cloned_database(template_db, "forked") as standby_url:
        fake = await asyncpg.connect(standby_url)
        try:
            await fake.execute(REPLAYED_EVERYTHING_SQL)
        finally:
            await fake.close()
        async with asyncpg.create_pool(
            standby_url, min_size=0, max_size=1, server_settings={"search_path": "replayed, pg_catalog, public"}
        ) as standby:
            if standby_generation is not None:
                await insert_operation(standby, "op-claimed", "RUNNING", generation=standby_generation)
            claim = functools.partial(leases.claim_visible, operation_id="op-claimed", generation=CLAIMED_GENERATION)
            before, primary_before = fallbacks("claim_not_visible"), reads("primary")
            source = ReadSource(primary=pool, standby=standby, wait_seconds=WAIT_SECONDS).claimed(claim)
            export_reads = await source.begin()
            first, second = await export_reads.run(served_by), await export_reads.run(served_by)
            export_reads.finish()
    primary_name = await pool.fetchval("SELECT current_database()")
    assert first == second
    assert (first != primary_name) is served_on_standby
    assert fallbacks("claim_not_visible") == before + (0 if served_on_standby else 1)
    assert reads("primary") == primary_before + (0 if served_on_standby else 1)


async def test_a_session_the_server_ends_keeps_the_server_s_error_as_the_cause(pool: asyncpg.Pool) -> None:
    """A standby ends a session for a recovery conflict that arrives between two messages of a statement; asyncpg
    raises ``ConnectionDoesNotExistError`` then, with the server's FATAL error as its cause. An ended session
    here shows that shape, and a conflict in that place counts as a conflict.
    """
    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.ConnectionDoesNotExistError) as ended:
            await conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    assert isinstance(ended.value.__cause__, asyncpg.AdminShutdownError)
    assert not recovery_conflict(ended.value)

    # As asyncpg builds it when the connection is lost: the server's error is the cause, not the context.
    lost = asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")
    lost.__cause__ = asyncpg.SerializationError("terminating connection due to conflict with recovery")
    assert recovery_conflict(lost)
