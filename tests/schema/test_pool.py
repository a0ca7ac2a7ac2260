"""The product's connection pool (``shared.db.create_pool``) on real Postgres: a connection goes back to the
pool without asyncpg's reset round trip, so what the skipped reset would have cleaned must never survive a
release (docs/benchmark.md: Benchmark, What was tuned).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import asyncpg

from devtools.servers import TcpProxy
from shared.db import close_connection, create_pool
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


async def test_a_connection_that_cannot_close_in_time_is_dropped_without_an_error(settings: Settings) -> None:
    # A part stopping after its server stopped answering (or after being frozen past the server's patience):
    # asyncpg's graceful close raises TimeoutError, which once ended a stopping relay with a traceback.
    target = urlsplit(settings.database_url)
    with TcpProxy(target.hostname or "127.0.0.1", target.port or 5432) as proxy:
        through = target._replace(netloc=f"{target.username}@127.0.0.1:{proxy.port}").geturl()
        conn = await asyncpg.connect(through)
        assert await conn.fetchval("SELECT 1") == 1
        proxy.throttle(1)  # a byte a second: the close's Terminate message never gets through in time
        await close_connection(conn, timeout_seconds=0.2)
        assert conn.is_closed()


async def test_pooled_sessions_never_compile_statements(settings: Settings) -> None:
    """JIT compilation is off on every pooled session, whatever the server's default (docs/operations.md:
    Database sessions).
    """
    single = await create_pool(settings.model_copy(update={"database_pool_max": 1}))
    try:
        async with single.acquire() as conn:
            assert await conn.fetchval("SHOW jit") == "off"
    finally:
        await single.close()
