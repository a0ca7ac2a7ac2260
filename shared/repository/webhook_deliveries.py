"""The ``webhook_deliveries`` and ``webhook_attempts`` tables: completion callbacks waiting to be sent,
and every attempt to send one (docs/api.md: Completion callbacks). Rows are written by the
trigger of migration 0006 in the transaction that ends the operation, and by migration 0013's
``pause_export_schedule`` in the transaction that pauses a schedule for a reason of the system's (a
``schedule.paused`` row names the schedule instead of an operation). The relay claims due ones with a lease
(``SKIP LOCKED``, so several relays share the work), sends them with no transaction open, and records the
attempts under the fencing generation of its claim (migration 0016).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from shared.repository.rows import Row


@dataclass(frozen=True)
class Delivery(Row):
    """A callback to send: its stable ``webhook_id`` (the same on every retry), what it reports (an
    operation, or for ``schedule.paused`` a schedule: exactly one of ``operation_id`` and ``schedule_id``),
    the event type, the URL, how many attempts were made, and its age in seconds; ``traceparent``: the trace
    context stored with what it reports (None when it was created with tracing off); ``generation``: the
    fencing generation of this claim.
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
    generation: int


# What the claim computes beside the delivery's own columns (migration 0021).
_COMPUTED = ("age_seconds", "created_at_epoch", "traceparent")
_CLAIMED = ", ".join(
    [
        *(f"(c.delivery).{name}" for name in Delivery.__dataclass_fields__ if name not in _COMPUTED),
        *(f"c.{name}" for name in _COMPUTED),
    ]
)


async def claim_due(conn: asyncpg.Connection, *, limit: int, lease_seconds: float) -> list[Delivery]:
    """Claim up to ``limit`` due deliveries, oldest first, in one statement (``claim_webhook_deliveries_v1``):
    each is leased for ``lease_seconds`` (it is due again after that unless its attempt is recorded) and its
    fencing generation bumped.
    """
    rows = await conn.fetch(f"SELECT {_CLAIMED} FROM claim_webhook_deliveries_v1($1, $2) c", limit, lease_seconds)
    deliveries = [Delivery.from_row(row) for row in rows]
    return sorted(deliveries, key=lambda delivery: delivery.delivery_id)


async def extend(conn: asyncpg.Connection, deliveries: list[Delivery], *, lease_seconds: float) -> int:
    """Extend the lease of ``deliveries``, as claimed, to ``lease_seconds`` from now, in one statement
    (``extend_webhook_deliveries_v1``); one whose attempt was recorded since, or that was claimed again, is left
    as it is. Returns how many were extended: 0 once every attempt is recorded.
    """
    extended: int = await conn.fetchval(
        "SELECT extend_webhook_deliveries_v1($1, $2, $3, $4)",
        [delivery.delivery_id for delivery in deliveries],
        [delivery.generation for delivery in deliveries],
        [delivery.attempts for delivery in deliveries],
        lease_seconds,
    )
    return extended


@dataclass(frozen=True)
class Attempt:
    """One attempt to send ``delivery``, begun at ``attempted_at`` (the sender's clock, aware): ``status_code``
    None when no answer came, ``duration_ms`` from the lookup to the last byte read, ``error`` a short text
    without the URL, and ``retry_seconds`` until the next attempt, None for none (delivered, or given up).
    """

    delivery: Delivery
    attempted_at: datetime
    status_code: int | None
    duration_ms: int
    error: str | None
    retry_seconds: float | None

    @property
    def delivered(self) -> bool:
        """A 2xx answer."""
        return is_delivered(self.status_code)


def is_delivered(status_code: int | None) -> bool:
    """Whether a receiver's answer ``status_code`` (None: no answer) delivers a callback: any 2xx
    (docs/api.md: Completion callbacks).
    """
    return status_code is not None and 200 <= status_code < 300


async def record_attempts(conn: asyncpg.Connection, attempts: list[Attempt]) -> list[int]:
    """Record ``attempts`` in one statement (``record_webhook_attempts_v1``): each delivery delivered on a
    2xx, else due again after its ``retry_seconds`` or given up when that is None, and one ``webhook_attempts``
    row each. An attempt whose delivery was claimed again since (its lease ran out: another generation)
    changes nothing. Returns the delivery ids recorded.
    """
    rows = await conn.fetch(
        "SELECT delivery_id FROM record_webhook_attempts_v1($1, $2, $3, $4, $5, $6, $7, $8) AS r(delivery_id)",
        [attempt.delivery.delivery_id for attempt in attempts],
        [attempt.delivery.generation for attempt in attempts],
        [attempt.delivered for attempt in attempts],
        [attempt.status_code for attempt in attempts],
        [attempt.duration_ms for attempt in attempts],
        [attempt.error for attempt in attempts],
        [attempt.retry_seconds for attempt in attempts],
        [attempt.attempted_at for attempt in attempts],
    )
    return [row["delivery_id"] for row in rows]


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
