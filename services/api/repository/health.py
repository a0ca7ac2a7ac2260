"""SQL of the readiness probe."""

from __future__ import annotations

import asyncpg


async def ping(conn: asyncpg.Connection) -> None:
    """Run a trivial query; raises what the driver raises when the database cannot answer."""
    await conn.fetchval("SELECT 1")
