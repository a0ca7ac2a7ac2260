"""All SQL of the relay (README: How it works: claimed by the unpublished flag with SKIP LOCKED)."""

from __future__ import annotations

import asyncpg


async def claim_due(conn: asyncpg.Connection, *, limit: int) -> list[asyncpg.Record]:
    """Lock up to ``limit`` due, unpublished rows, oldest first; other relays skip them.

    Must run inside the transaction that later marks them, so the locks hold until then.
    """
    rows: list[asyncpg.Record] = await conn.fetch(
        """
        SELECT outbox_id, operation_id, routing_key, payload::text AS payload
        FROM outbox
        WHERE published_at IS NULL AND not_before <= now()
        ORDER BY not_before, outbox_id
        LIMIT $1
        FOR UPDATE SKIP LOCKED
        """,
        limit,
    )
    return rows


async def mark_published(conn: asyncpg.Connection, *, outbox_ids: list[int]) -> None:
    """Mark rows published: only after the broker confirmed them."""
    await conn.execute(
        "UPDATE outbox SET published_at = now(), publish_attempts = publish_attempts + 1"
        " WHERE outbox_id = ANY($1::bigint[])",
        outbox_ids,
    )


async def mark_failed(conn: asyncpg.Connection, *, outbox_ids: list[int], retry_seconds: float) -> None:
    """Count a failed publish and hold the rows back ``retry_seconds`` so a bad row cannot block the rest."""
    await conn.execute(
        """
        UPDATE outbox SET publish_attempts = publish_attempts + 1,
            not_before = now() + make_interval(secs => $2)
        WHERE outbox_id = ANY($1::bigint[])
        """,
        outbox_ids,
        retry_seconds,
    )


async def seconds_until_next_due(conn: asyncpg.Connection) -> float | None:
    """Seconds until the earliest unpublished row is due (0 if one is due now); None when none waits."""
    # Not greatest(0, ...) in SQL: Postgres' greatest skips NULLs, and an empty outbox would read as due.
    value: float | None = await conn.fetchval(
        "SELECT extract(epoch FROM min(not_before) - now())::float8 FROM outbox WHERE published_at IS NULL"
    )
    return None if value is None else max(value, 0.0)
