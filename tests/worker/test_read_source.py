"""Where an attempt's reads go when its read URL names no usable standby (docs/deploy.md: Export reads on a hot
standby), on the real Postgres: a server that is not in recovery, and one that refuses the session, both send
the reads to the primary at once, and the reason is counted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from prometheus_client import REGISTRY

from services.worker.read_source import ReadSource
from shared.settings import Settings

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
