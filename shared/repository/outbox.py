"""The ``outbox`` table (docs/architecture.md: How it works): scheduling intent written in the caller's transaction, and
the relay's claim of it.

A row is a request to publish ``{"operation_id": ...}`` (a chunk's: with ``"chunk": n``) to the work exchange
no earlier than ``not_before``. The relay publishes it; an insert trigger NOTIFYs the relay so it need not poll. Relays
claim rows by the unpublished flag with ``SKIP LOCKED``. Each row carries the version of its payload
(``shared.payloads``); one that no relay of this release reads is put back, and dead-lettered past the delivery
limit: ``dead_lettered_at`` set and ``not_before`` at infinity, so that no relay of any release claims it again.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from shared.broker import CHUNK_ROUTING_KEY, EXPORT_ROUTING_KEY
from shared.payloads import PAYLOAD_VERSION
from shared.repository.rows import Row


async def enqueue_run(conn: asyncpg.Connection, *, operation_id: str, delay_seconds: float = 0.0) -> None:
    """Add an outbox row that wakes a worker for ``operation_id`` after ``delay_seconds``.

    Runs in the caller's transaction, so the intent commits or vanishes together with the state change.
    """
    await _enqueue(conn, operation_id, EXPORT_ROUTING_KEY, None, delay_seconds)


async def enqueue_chunk(conn: asyncpg.Connection, *, operation_id: str, chunk_no: int) -> None:
    """Add an outbox row that wakes a worker for chunk ``chunk_no`` of ``operation_id`` on the chunk queue
    (``shared.broker.CHUNK_ROUTING_KEY``), in the caller's transaction.
    """
    await _enqueue(conn, operation_id, CHUNK_ROUTING_KEY, chunk_no, 0.0)


async def _enqueue(
    conn: asyncpg.Connection, operation_id: str, routing_key: str, chunk_no: int | None, delay_seconds: float
) -> None:
    # The payload is built by the database function that the submit and a schedule's run use too (migration 0020).
    await conn.execute(
        "SELECT enqueue_wake_up_v1($1, $2, $3, $4, $5)",
        operation_id,
        routing_key,
        chunk_no,
        delay_seconds,
        PAYLOAD_VERSION,
    )


@dataclass(frozen=True)
class OutboxRow(Row):
    """A wake-up to publish: ``payload`` (JSON text, of version ``payload_version``) to ``routing_key`` of the
    work exchange, in the trace of its operation (``traceparent``, None when the operation was created with
    tracing off).
    """

    outbox_id: int
    operation_id: str
    routing_key: str
    payload: str
    payload_version: int
    traceparent: str | None


@dataclass(frozen=True)
class Claim:
    """One claim of the relay: ``rows`` locked for it, oldest first, and ``next_due_seconds``, how long until
    the earliest unpublished row it did not claim is due (0 if one is due now: another relay holds it), None
    when none waits. The relay waits that long at most before its next claim, so a row held back by a failed
    publish, or claimed and then lost by a relay that died, goes out when it is due, not a poll interval later.
    """

    rows: list[OutboxRow]
    next_due_seconds: float | None


async def claim_due(conn: asyncpg.Connection, *, limit: int) -> Claim:
    """Lock up to ``limit`` due, unpublished rows, oldest first (other relays skip them), and read when the
    earliest row left is due, in one statement.

    Must run inside the transaction that later marks them, so the locks hold until then. Each row comes with
    its operation's stored trace context, whoever wrote the row (docs/monitoring.md: Monitoring, Traces).
    """
    # FOR UPDATE in the CTE locks the outbox rows only, never the operations. The one-row left join carries
    # the next due time when nothing is claimed. Not greatest(0, ...) in SQL: Postgres' greatest skips NULLs,
    # and an empty outbox would read as due.
    rows = await conn.fetch(
        """
        WITH claimed AS (
            SELECT outbox_id, operation_id, routing_key, payload::text AS payload, payload_version, not_before
            FROM outbox
            WHERE published_at IS NULL AND not_before <= now()
            ORDER BY not_before, outbox_id
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ), waiting AS (
            SELECT extract(epoch FROM min(w.not_before) - now())::float8 AS next_due_seconds
            FROM outbox w
            WHERE w.published_at IS NULL AND w.dead_lettered_at IS NULL
              AND w.outbox_id NOT IN (SELECT outbox_id FROM claimed)
        )
        SELECT c.outbox_id, c.operation_id, c.routing_key, c.payload, c.payload_version,
               (SELECT o.traceparent FROM operations o WHERE o.operation_id = c.operation_id) AS traceparent,
               waiting.next_due_seconds
        FROM waiting LEFT JOIN claimed c ON true
        ORDER BY c.not_before, c.outbox_id
        """,
        limit,
    )
    due = rows[0]["next_due_seconds"]
    return Claim(
        rows=[OutboxRow.from_row(row) for row in rows if row["outbox_id"] is not None],
        next_due_seconds=None if due is None else max(due, 0.0),
    )


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


async def put_back(conn: asyncpg.Connection, *, outbox_ids: list[int], retry_seconds: float, limit: int) -> int:
    """Put back rows whose payload version this relay does not read: for a relay that reads it, in
    ``retry_seconds``; a row put back ``limit`` times is dead-lettered instead. Returns how many were.
    """
    dead: int = await conn.fetchval(
        """
        WITH counted AS (
            UPDATE outbox SET publish_attempts = publish_attempts + 1,
                not_before = CASE WHEN publish_attempts + 1 >= $3 THEN 'infinity'
                                  ELSE now() + make_interval(secs => $2) END,
                dead_lettered_at = CASE WHEN publish_attempts + 1 >= $3 THEN now() END
            WHERE outbox_id = ANY($1::bigint[])
            RETURNING dead_lettered_at
        )
        SELECT count(dead_lettered_at) FROM counted
        """,
        outbox_ids,
        retry_seconds,
        limit,
    )
    return dead


async def purge_published(conn: asyncpg.Connection, *, older_than_seconds: float) -> int:
    """Delete outbox rows published more than ``older_than_seconds`` ago; return how many."""
    status = await conn.execute(
        "DELETE FROM outbox WHERE published_at < now() - make_interval(secs => $1)", older_than_seconds
    )
    return int(status.split()[-1])


async def delete_for(conn: asyncpg.Connection, *, operation_ids: list[str]) -> None:
    """Delete every outbox row of ``operation_ids``, in the transaction that purges those operations."""
    await conn.execute("DELETE FROM outbox WHERE operation_id = ANY($1::text[])", operation_ids)


async def backlog(conn: asyncpg.Connection) -> tuple[int, float]:
    """The outbox gauges, by the database clock: (unpublished rows, how long the longest-waiting DUE row
    has waited since it became due, 0 when none). A retry's row is not due before its ``not_before``, so a
    scheduled retry does not look like a stuck relay.
    """
    row = await conn.fetchrow(
        """
        SELECT count(*) AS waiting,
               coalesce(extract(epoch FROM now() - min(greatest(created_at, not_before))
                                FILTER (WHERE not_before <= now()))::float8, 0) AS oldest_age_seconds
        FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL
        """
    )
    return row["waiting"], row["oldest_age_seconds"]
