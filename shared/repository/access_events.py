"""The ``access_events`` table: who did what to an operation's result, and how it ended (docs/api.md: Downloads, Access
events).
"""

from __future__ import annotations

import asyncpg


async def record_access_event(
    conn: asyncpg.Connection, *, operation_id: str, user_id: str, action: str, outcome: str
) -> None:
    """Record who did ``action`` (``download``, ``delete_result``) on which operation and its ``outcome``
    (docs/api.md: Downloads, Access events). Run it in the transaction of what it records, if any.
    """
    await conn.execute(
        "INSERT INTO access_events (operation_id, user_id, action, outcome) VALUES ($1, $2, $3, $4)",
        operation_id,
        user_id,
        action,
        outcome,
    )


async def newest_access_events(conn: asyncpg.Connection, *, operation_id: str, limit: int) -> list[asyncpg.Record]:
    """The newest ``limit`` access events naming the operation, oldest first: (user_id, action, outcome,
    occurred_at).
    """
    rows: list[asyncpg.Record] = await conn.fetch(
        """
        SELECT user_id, action, outcome, occurred_at FROM (
            SELECT access_event_id, user_id, action, outcome, occurred_at
            FROM access_events WHERE operation_id = $1
            ORDER BY occurred_at DESC, access_event_id DESC LIMIT $2) newest
        ORDER BY occurred_at, access_event_id
        """,
        operation_id,
        limit,
    )
    return rows


async def count_access_events(conn: asyncpg.Connection, *, operation_id: str) -> int:
    """How many access events name the operation."""
    count: int = await conn.fetchval("SELECT count(*) FROM access_events WHERE operation_id = $1", operation_id)
    return count
