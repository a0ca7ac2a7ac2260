"""The janitor's side of the ``operations`` table: its sweeps over every operation, results to expire,
stranded work to wake, abandoned cancellations, records to purge, and the counts of its gauges (docs/states.md:
States and failure model).

Every function runs on the caller's connection, in the caller's transaction if any.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from shared.repository.rows import Row
from shared.states import PURGEABLE, values


@dataclass(frozen=True)
class ExpiredResult(Row):
    """A result ``expire_results`` moved to EXPIRED, and its owner."""

    operation_id: str
    owner_id: str


async def expire_results(conn: asyncpg.Connection, *, limit: int) -> list[ExpiredResult]:
    """SUCCEEDED -> EXPIRED for results past ``result_expires_at``; return (operation_id, owner_id).

    The state moves first, so a download is refused (410) before the object disappears; an object whose
    deletion then fails stays recorded and ``stale_artifacts`` returns it later, so there is never a
    SUCCEEDED without its file.
    """
    rows = await conn.fetch(
        """
        UPDATE operations o SET state = 'EXPIRED', progress_phase = 'expired', updated_at = now()
        WHERE o.operation_id IN (
            SELECT operation_id FROM operations
            WHERE state = 'SUCCEEDED' AND result_expires_at <= now()
            ORDER BY result_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)
          AND o.state = 'SUCCEEDED'
        RETURNING o.operation_id, o.owner_id
        """,
        limit,
    )
    return [ExpiredResult.from_row(row) for row in rows]


# Why an operation needs a new wake-up, as ``stranded_operations`` names it.
REQUEUE_REASONS = ("lease_expired", "retry_due", "message_lost")


@dataclass(frozen=True)
class StrandedOperation(Row):
    """An operation that needs a new wake-up, and why: one of ``REQUEUE_REASONS``."""

    operation_id: str
    reason: str


async def stranded_operations(conn: asyncpg.Connection, *, quiet_seconds: float, limit: int) -> list[StrandedOperation]:
    """Operations that need a wake-up, with the reason (one of ``REQUEUE_REASONS``): expired leases, due
    retries, and QUEUED ones whose message was lost. Returns (operation_id, reason).

    Skipped: an operation with a wake-up still to publish, or one published within ``quiet_seconds`` (and,
    for an expired lease, after the lease expired: a wake-up older than the expiry was for the holder that
    died, so the first pass after the expiry sends a new one; docs/states.md: States and failure model).
    """
    rows = await conn.fetch(
        """
        SELECT o.operation_id,
               CASE o.state WHEN 'RUNNING' THEN 'lease_expired' WHEN 'RETRY_AT' THEN 'retry_due'
                            ELSE 'message_lost' END AS reason
        FROM operations o
        WHERE operation_is_runnable(o.state, o.retry_at, o.lease_expires_at)
          AND (o.state <> 'QUEUED' OR o.updated_at < now() - make_interval(secs => $1))
          AND NOT EXISTS (
              SELECT 1 FROM outbox b WHERE b.operation_id = o.operation_id
                AND (b.published_at IS NULL
                     OR (b.published_at > now() - make_interval(secs => $1)
                         AND (o.state <> 'RUNNING' OR b.published_at > o.lease_expires_at))))
        ORDER BY o.updated_at LIMIT $2
        """,
        quiet_seconds,
        limit,
    )
    return [StrandedOperation.from_row(row) for row in rows]


@dataclass(frozen=True)
class OperationGeneration(Row):
    """An operation and the fencing generation of its current or last lease."""

    operation_id: str
    generation: int


async def abandoned_cancellations(conn: asyncpg.Connection, *, limit: int) -> list[OperationGeneration]:
    """CANCEL_REQUESTED operations that no live lease holder will finish: (operation_id, generation)."""
    rows = await conn.fetch(
        """
        SELECT operation_id, generation FROM operations
        WHERE state = 'CANCEL_REQUESTED' AND (lease_expires_at IS NULL OR lease_expires_at < now())
        ORDER BY updated_at LIMIT $1
        """,
        limit,
    )
    return [OperationGeneration.from_row(row) for row in rows]


async def purge(conn: asyncpg.Connection, *, retention_seconds: int, limit: int) -> list[str]:
    """Delete ended operations created more than ``retention_seconds`` ago, with their idempotency keys,
    attempts and artifacts (cascade); return their ids, whose outbox rows the caller deletes in the same
    transaction (``outbox.delete_for``). Frees their keys (docs/api.md: Submitting an export, Submit).
    """
    rows = await conn.fetch(
        """
        DELETE FROM operations WHERE operation_id IN (
            SELECT operation_id FROM operations
            WHERE created_at < now() - make_interval(secs => $1)
              AND state = ANY($3::text[])
              -- Keep the record of an object not yet removed: it is the only pointer to it.
              AND NOT EXISTS (SELECT 1 FROM artifacts a
                              WHERE a.operation_id = operations.operation_id AND a.state <> 'DELETED')
            LIMIT $2)
        RETURNING operation_id
        """,
        float(retention_seconds),
        limit,
        values(PURGEABLE),
    )
    return [row["operation_id"] for row in rows]


@dataclass(frozen=True)
class StateFigure(Row):
    """How many operations are in ``state``, and the age of the oldest ``updated_at`` among them."""

    state: str
    operations: int
    oldest_age_seconds: float


async def state_figures(conn: asyncpg.Connection) -> list[StateFigure]:
    """Counts for the system gauges, judged by the database clock: one row per operation state present,
    (state, operations, oldest_age_seconds since the oldest ``updated_at`` in that state).
    """
    rows = await conn.fetch(
        """
        SELECT state, count(*) AS operations,
               greatest(extract(epoch FROM now() - min(updated_at))::float8, 0) AS oldest_age_seconds
        FROM operations GROUP BY state
        """
    )
    return [StateFigure.from_row(row) for row in rows]
