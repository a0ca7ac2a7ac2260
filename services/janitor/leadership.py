"""The janitor's leadership: one janitor acts at a time, holding a session-level advisory lock; the others
wait for their next pass (docs/deploy.md: Deployment and scaling).
"""

from __future__ import annotations

import asyncpg

# The janitor's leader lock: one janitor acts at a time, the others wait for their next pass.
LEADER_LOCK_KEY = 0x63686A61  # "chja"


async def try_lead(conn: asyncpg.Connection) -> bool:
    """Take the leader lock on this session if it is free; the lock lasts as long as the connection."""
    locked: bool = await conn.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_LOCK_KEY)
    return locked


async def still_leading(conn: asyncpg.Connection) -> None:
    """Touch the leader's session, so it is not ended as idle; raises the driver's error when it is gone."""
    await conn.execute("SELECT 1")
