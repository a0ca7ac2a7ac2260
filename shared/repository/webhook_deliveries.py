"""The ``webhook_deliveries`` and ``webhook_attempts`` tables: completion callbacks waiting to be sent,
and every attempt to send one (docs/api.md: API reference, Completion callbacks). Rows are written by the
trigger of migration 0006 in the transaction that ends the operation, and by migration 0013's
``pause_export_schedule`` in the transaction that pauses a schedule for a reason of the system's (a
``schedule.paused`` row names the schedule instead of an operation); the relay claims due ones with
``SKIP LOCKED``, so several relays share the work.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from shared.repository.rows import Row


@dataclass(frozen=True)
class Delivery(Row):
    """A callback to send: its stable ``webhook_id`` (the same on every retry), what it reports (an
    operation, or for ``schedule.paused`` a schedule: exactly one of ``operation_id`` and ``schedule_id``),
    the event type, the URL, how many attempts were made, and its age in seconds; ``traceparent``: the trace
    context stored with what it reports (None when it was created with tracing off).
    """

    delivery_id: int
    webhook_id: str
    operation_id: str | None
    schedule_id: str | None
    owner_id: str
    event_type: str
    url: str
    attempts: int
    age_seconds: float
    created_at_epoch: int
    traceparent: str | None


async def claim_due(conn: asyncpg.Connection, *, limit: int) -> list[Delivery]:
    """Lock up to ``limit`` due deliveries, oldest first; run it in the transaction that records their
    attempts, so the locks hold until then. Subqueries, not joins, read the trace context: only the
    deliveries are locked.
    """
    rows = await conn.fetch(
        """
        SELECT delivery_id, webhook_id, operation_id, schedule_id, owner_id, event_type, url, attempts,
               extract(epoch FROM now() - created_at)::float8 AS age_seconds,
               extract(epoch FROM created_at)::bigint AS created_at_epoch,
               coalesce((SELECT o.traceparent FROM operations o WHERE o.operation_id = d.operation_id),
                        (SELECT s.traceparent FROM export_schedules s WHERE s.schedule_id = d.schedule_id))
                   AS traceparent
        FROM webhook_deliveries d
        WHERE delivered_at IS NULL AND gave_up_at IS NULL AND next_attempt_at <= now()
        ORDER BY next_attempt_at, delivery_id
        LIMIT $1
        FOR UPDATE SKIP LOCKED
        """,
        limit,
    )
    return [Delivery.from_row(row) for row in rows]


async def record_attempt(
    conn: asyncpg.Connection,
    *,
    delivery_id: int,
    status_code: int | None,
    duration_ms: int,
    error: str | None,
    retry_seconds: float | None,
) -> None:
    """Record one attempt: delivered when ``status_code`` is 2xx; else retried after ``retry_seconds``,
    or given up when that is None.
    """
    delivered = status_code is not None and 200 <= status_code < 300
    async with conn.transaction():
        attempt = await conn.fetchval(
            """
            UPDATE webhook_deliveries SET attempts = attempts + 1,
                delivered_at = CASE WHEN $2 THEN now() END,
                gave_up_at = CASE WHEN NOT $2 AND $3::float8 IS NULL THEN now() END,
                next_attempt_at = CASE WHEN $3::float8 IS NULL THEN next_attempt_at
                                       ELSE now() + make_interval(secs => $3) END
            WHERE delivery_id = $1
            RETURNING attempts
            """,
            delivery_id,
            delivered,
            retry_seconds,
        )
        await conn.execute(
            """
            INSERT INTO webhook_attempts (delivery_id, attempt, status_code, duration_ms, error)
            VALUES ($1, $2, $3, $4, $5)
            """,
            delivery_id,
            attempt,
            status_code,
            duration_ms,
            error,
        )


async def oldest_undelivered_age(conn: asyncpg.Connection) -> float:
    """Seconds since the oldest delivery still waiting was written; 0 when none waits."""
    age: float = await conn.fetchval(
        """
        SELECT coalesce(extract(epoch FROM now() - min(created_at))::float8, 0) FROM webhook_deliveries
        WHERE delivered_at IS NULL AND gave_up_at IS NULL
        """
    )
    return age


async def list_for_operation(conn: asyncpg.Connection, *, operation_id: str) -> list[asyncpg.Record]:
    """Every delivery of the operation with its attempts, oldest first, for the admin view: (webhook_id,
    event_type, created_at, delivered_at, gave_up_at, attempts: [{attempt, attempted_at, status_code,
    duration_ms, error}]).
    """
    rows: list[asyncpg.Record] = await conn.fetch(
        """
        SELECT d.webhook_id, d.event_type, d.created_at, d.delivered_at, d.gave_up_at,
               coalesce(json_agg(json_build_object(
                   'attempt', a.attempt, 'attempted_at', a.attempted_at, 'status_code', a.status_code,
                   'duration_ms', a.duration_ms, 'error', a.error) ORDER BY a.attempt)
                   FILTER (WHERE a.attempt IS NOT NULL), '[]')::text AS attempts
        FROM webhook_deliveries d LEFT JOIN webhook_attempts a USING (delivery_id)
        WHERE d.operation_id = $1
        GROUP BY d.delivery_id ORDER BY d.delivery_id
        """,
        operation_id,
    )
    return rows
