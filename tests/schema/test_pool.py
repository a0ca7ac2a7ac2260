"""The product's connection pool (``shared.db.create_pool``) on real Postgres: a connection goes back to the
pool without asyncpg's reset round trip, so what the skipped reset would have cleaned must never survive a
release (docs/benchmark.md: Benchmark, What was tuned).
"""

from __future__ import annotations

import asyncpg

from shared.db import create_pool
from shared.settings import Settings

LOCK_KEY = 912_345


async def test_a_transaction_left_open_is_rolled_back_with_its_locks_on_release(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    single = await create_pool(settings.model_copy(update={"database_pool_max": 1}))
    try:
        async with single.acquire() as conn:
            backend = await conn.fetchval("SELECT pg_backend_pid()")
            # Unmanaged: as if a caller lost track of its transaction.
            await conn.execute("BEGIN")
            await conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK_KEY)
            await conn.execute("CREATE TABLE left_open (n int)")
        async with single.acquire() as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") == backend  # the same session, reused
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SELECT to_regclass('left_open')") is None
        held = await pool.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $1", LOCK_KEY)
        assert held == 0
    finally:
        await single.close()
