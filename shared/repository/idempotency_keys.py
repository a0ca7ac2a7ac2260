"""The ``idempotency_keys`` table: a user's keys and the operation each created (README: API reference,
Submit). Rows go with their operation (``ON DELETE CASCADE``).
"""

from __future__ import annotations

import asyncpg


async def find_idempotency_key(
    conn: asyncpg.Connection, *, owner_id: str, idempotency_key: str, replay_window_seconds: int
) -> asyncpg.Record | None:
    """The remembered use of ``idempotency_key`` by ``owner_id``: fingerprint, operation_id, expired."""
    return await conn.fetchrow(
        """
        SELECT fingerprint, operation_id,
               created_at + make_interval(secs => $3) <= now() AS expired
        FROM idempotency_keys WHERE owner_id = $1 AND idempotency_key = $2
        """,
        owner_id,
        idempotency_key,
        float(replay_window_seconds),
    )


async def insert_idempotency_key(
    conn: asyncpg.Connection, *, owner_id: str, idempotency_key: str, fingerprint: str, operation_id: str
) -> None:
    """Remember ``idempotency_key`` of ``owner_id`` for the operation it created."""
    await conn.execute(
        """
        INSERT INTO idempotency_keys (owner_id, idempotency_key, fingerprint, operation_id)
        VALUES ($1, $2, $3, $4)
        """,
        owner_id,
        idempotency_key,
        fingerprint,
        operation_id,
    )
