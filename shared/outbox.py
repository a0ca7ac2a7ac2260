"""The transactional outbox (README: How it works): scheduling intent written in the caller's transaction.

A row is a request to publish ``{"operation_id": ...}`` to the work exchange no earlier than
``not_before``. The relay publishes it; an insert trigger NOTIFYs the relay so it need not poll.
"""

from __future__ import annotations

import json

import asyncpg

from shared.broker import EXPORT_ROUTING_KEY


async def enqueue_run(conn: asyncpg.Connection, *, operation_id: str, delay_seconds: float = 0.0) -> None:
    """Add an outbox row that wakes a worker for ``operation_id`` after ``delay_seconds``.

    Runs in the caller's transaction, so the intent commits or vanishes together with the state change.
    """
    await conn.execute(
        """
        INSERT INTO outbox (operation_id, routing_key, payload, not_before)
        VALUES ($1, $2, $3::jsonb, now() + make_interval(secs => $4))
        """,
        operation_id,
        EXPORT_ROUTING_KEY,
        json.dumps({"operation_id": operation_id}),
        delay_seconds,
    )
