"""The janitor's leadership: one janitor acts at a time, holding a session-level advisory lock; the others
wait for their next pass (docs/deploy.md: Deployment and scaling).
"""

from __future__ import annotations

import asyncpg

from shared.db import require_writable

# The janitor's leader lock: one janitor acts at a time, the others wait for their next pass.
LEADER_LOCK_KEY = 0x63686A61  # "chja"


async def try_lead(conn: asyncpg.Connection) -> bool:
    """Take the leader lock on this session if it is free; the lock lasts as long as the connection.

    Raises ``shared.db.ReadOnlyServer`` when the session is not on the primary: a standby grants advisory
    locks too, and a lock there excludes nobody who works on the primary.
    """
    await require_writable(conn)
    locked: bool = await conn.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_LOCK_KEY)
    return locked


async def still_leading(conn: asyncpg.Connection) -> None:
    """Touch the leader's session, so it is not ended as idle; raises the driver's error when it is gone, and
    ``shared.db.ReadOnlyServer`` when its server no longer takes writes (demoted, or a standby promoted past it:
    the lock no longer excludes the janitors on the new primary). ``SELECT 1`` would pass on a standby.
    """
    await require_writable(conn)
