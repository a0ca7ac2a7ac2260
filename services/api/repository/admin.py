"""SQL of the admin view of an operation: its attempts, artifacts and access events (run them with
``operations.get_operation`` in one repeatable-read transaction to see them as of one moment).
"""

from __future__ import annotations

import asyncpg


async def attempts(conn: asyncpg.Connection, *, operation_id: str) -> list[asyncpg.Record]:
    """Every recorded claim of the operation, oldest generation first: (generation, attempt, worker_id,
    claimed_at, ended_at, outcome, error_code); ``ended_at`` and ``outcome`` are NULL while it runs.
    """
    rows: list[asyncpg.Record] = await conn.fetch(
        """
        SELECT generation, attempt, worker_id, claimed_at, ended_at, outcome, error_code
        FROM attempts WHERE operation_id = $1 ORDER BY generation
        """,
        operation_id,
    )
    return rows


async def artifacts(conn: asyncpg.Connection, *, operation_id: str) -> list[asyncpg.Record]:
    """Every artifact recorded for the operation, oldest generation first: (generation, object_key, state,
    upload_id, size_bytes, sha256, message_count, created_at, updated_at).
    """
    rows: list[asyncpg.Record] = await conn.fetch(
        """
        SELECT generation, object_key, state, upload_id, size_bytes, sha256, message_count, created_at, updated_at
        FROM artifacts WHERE operation_id = $1 ORDER BY generation
        """,
        operation_id,
    )
    return rows


async def access_events(conn: asyncpg.Connection, *, operation_id: str, limit: int) -> list[asyncpg.Record]:
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
