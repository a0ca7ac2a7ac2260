"""All SQL of the janitor."""

from __future__ import annotations

import asyncpg

# The janitor's leader lock: one janitor acts at a time, the others wait for their next pass.
LEADER_LOCK_KEY = 0x63686A61  # "chja"


async def try_lead(conn: asyncpg.Connection) -> bool:
    """Take the leader lock on this session if it is free; the lock lasts as long as the connection."""
    locked: bool = await conn.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_LOCK_KEY)
    return locked


async def still_leading(conn: asyncpg.Connection) -> None:
    """Touch the leader's session, so it is not ended as idle; raises the driver's error when it is gone."""
    await conn.execute("SELECT 1")


async def expire_results(conn: asyncpg.Connection, *, limit: int) -> list[asyncpg.Record]:
    """SUCCEEDED -> EXPIRED for results past ``result_expires_at``; return (operation_id, owner_id).

    The state moves first, so a download is refused (410) before the object disappears; an object whose
    deletion then fails stays recorded and ``stale_artifacts`` returns it later, so there is never a
    SUCCEEDED without its file.
    """
    rows: list[asyncpg.Record] = await conn.fetch(
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
    return rows


async def stale_artifacts(conn: asyncpg.Connection, *, grace_seconds: float, limit: int) -> list[asyncpg.Record]:
    """Artifacts whose object must go, untouched for ``grace_seconds``: never publishable (a newer
    generation holds their operation, or it ended without them), or an EXPIRED result whose deletion
    failed when it expired. Returns (operation_id, generation, object_key, state, left_behind), where
    ``left_behind`` marks the never publishable ones: an attempt ended (crashed, superseded, failed)
    without either publishing its artifact or finishing its removal, so the outcome it left is unknown.
    """
    rows: list[asyncpg.Record] = await conn.fetch(
        """
        SELECT operation_id, generation, object_key, state, left_behind FROM (
            SELECT a.operation_id, a.generation, a.object_key, a.state, a.updated_at,
                   o.state = 'EXPIRED' AS expired_result,
                   (a.state <> 'PUBLISHED'
                    AND (a.generation < o.generation
                         OR o.state IN ('SUCCEEDED', 'CANCELED', 'FAILED', 'FAILED_REPAIR'))) AS left_behind
            FROM artifacts a JOIN operations o USING (operation_id)
            WHERE a.state <> 'DELETED' AND a.updated_at < now() - make_interval(secs => $1)) candidates
        WHERE expired_result OR left_behind
        ORDER BY updated_at LIMIT $2
        """,
        grace_seconds,
        limit,
    )
    return rows


async def live_artifacts(conn: asyncpg.Connection, *, object_keys: list[str]) -> dict[str, asyncpg.Record]:
    """The artifact records among ``object_keys`` that may still be written, published or served, or are
    being removed (any state but DELETED): object key -> (state, upload_id). A key missing from the
    result has no record, or a DELETED one, and can never get a live one: a record is made before its
    key's first byte (README: How it works) and never leaves DELETED.
    """
    rows = await conn.fetch(
        """
        SELECT object_key, state, upload_id FROM artifacts
        WHERE object_key = ANY($1::text[]) AND state <> 'DELETED'
        """,
        object_keys,
    )
    return {row["object_key"]: row for row in rows}


async def purge(conn: asyncpg.Connection, *, retention_seconds: int, limit: int) -> int:
    """Delete ended operations created more than ``retention_seconds`` ago, with their idempotency keys and artifacts
    (cascade) and outbox rows; return how many operations went. Frees their keys (README: API reference, Submit).
    """
    purged: int = await conn.fetchval(
        """
        WITH gone AS (
            DELETE FROM operations WHERE operation_id IN (
                SELECT operation_id FROM operations
                WHERE created_at < now() - make_interval(secs => $1)
                  AND state IN ('EXPIRED', 'CANCELED', 'FAILED', 'FAILED_REPAIR')
                  -- Keep the record of an object not yet removed: it is the only pointer to it.
                  AND NOT EXISTS (SELECT 1 FROM artifacts a
                                  WHERE a.operation_id = operations.operation_id AND a.state <> 'DELETED')
                LIMIT $2)
            RETURNING operation_id),
        outbox_gone AS (DELETE FROM outbox WHERE operation_id IN (SELECT operation_id FROM gone))
        SELECT count(*) FROM gone
        """,
        float(retention_seconds),
        limit,
    )
    return purged


async def purge_published_outbox(conn: asyncpg.Connection, *, older_than_seconds: float) -> int:
    """Delete outbox rows published more than ``older_than_seconds`` ago; return how many."""
    status = await conn.execute(
        "DELETE FROM outbox WHERE published_at < now() - make_interval(secs => $1)", older_than_seconds
    )
    return int(status.split()[-1])


# Why an operation needs a new wake-up, as ``stranded_operations`` names it.
REQUEUE_REASONS = ("lease_expired", "retry_due", "message_lost")


async def stranded_operations(conn: asyncpg.Connection, *, quiet_seconds: float, limit: int) -> list[asyncpg.Record]:
    """Operations that need a wake-up, with the reason (one of ``REQUEUE_REASONS``): expired leases, due
    retries, and QUEUED ones whose message was lost. Returns (operation_id, reason).

    Skipped: an operation with a wake-up still to publish, or one published within ``quiet_seconds`` (and,
    for an expired lease, after the lease expired: a wake-up older than the expiry was for the holder that
    died, so the first pass after the expiry sends a new one; README: States and failure model).
    """
    rows: list[asyncpg.Record] = await conn.fetch(
        """
        SELECT o.operation_id,
               CASE o.state WHEN 'RUNNING' THEN 'lease_expired' WHEN 'RETRY_AT' THEN 'retry_due'
                            ELSE 'message_lost' END AS reason
        FROM operations o
        WHERE ((o.state = 'RUNNING' AND o.lease_expires_at < now())
               OR (o.state = 'RETRY_AT' AND o.retry_at <= now())
               OR (o.state = 'QUEUED' AND o.updated_at < now() - make_interval(secs => $1)))
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
    return rows


async def abandoned_cancellations(conn: asyncpg.Connection, *, limit: int) -> list[asyncpg.Record]:
    """CANCEL_REQUESTED operations that no live lease holder will finish: (operation_id, generation)."""
    rows: list[asyncpg.Record] = await conn.fetch(
        """
        SELECT operation_id, generation FROM operations
        WHERE state = 'CANCEL_REQUESTED' AND (lease_expires_at IS NULL OR lease_expires_at < now())
        ORDER BY updated_at LIMIT $1
        """,
        limit,
    )
    return rows


async def system_figures(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    """Counts for the system gauges, judged by the database clock, in one statement: one row per
    operation state present, (state, operations, oldest_age_seconds since the oldest ``updated_at`` in
    that state), each carrying the outbox's (outbox_backlog: unpublished rows, outbox_oldest_age_seconds:
    how long the longest-waiting DUE row has waited since it became due, 0 when none). A retry's row is
    not due before its ``not_before``, so a scheduled retry does not look like a stuck relay. With no
    operation at all, one row whose ``state`` is NULL still carries the outbox figures.
    """
    rows: list[asyncpg.Record] = await conn.fetch(
        """
        WITH per_state AS (
            SELECT state, count(*) AS operations,
                   greatest(extract(epoch FROM now() - min(updated_at))::float8, 0) AS oldest_age_seconds
            FROM operations GROUP BY state),
        backlog AS (
            SELECT count(*) AS outbox_backlog,
                   coalesce(extract(epoch FROM now() - min(greatest(created_at, not_before))
                                    FILTER (WHERE not_before <= now()))::float8, 0) AS outbox_oldest_age_seconds
            FROM outbox WHERE published_at IS NULL)
        SELECT s.state, s.operations, s.oldest_age_seconds, b.outbox_backlog, b.outbox_oldest_age_seconds
        FROM backlog b LEFT JOIN per_state s ON true
        """
    )
    return rows
