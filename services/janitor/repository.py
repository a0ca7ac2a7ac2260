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
    failed when it expired. Returns (operation_id, generation, object_key).
    """
    rows: list[asyncpg.Record] = await conn.fetch(
        """
        SELECT a.operation_id, a.generation, a.object_key
        FROM artifacts a JOIN operations o USING (operation_id)
        WHERE a.state <> 'DELETED'
          AND a.updated_at < now() - make_interval(secs => $1)
          AND (o.state = 'EXPIRED'
               OR (a.state <> 'PUBLISHED'
                   AND (a.generation < o.generation
                        OR o.state IN ('SUCCEEDED', 'CANCELED', 'FAILED', 'FAILED_REPAIR'))))
        ORDER BY a.updated_at LIMIT $2
        """,
        grace_seconds,
        limit,
    )
    return rows


async def record_deletion(conn: asyncpg.Connection, *, operation_id: str, owner_id: str) -> None:
    """Record a result deletion beside the download attempts (contract 5.5's access events)."""
    await conn.execute(
        "INSERT INTO access_events (operation_id, user_id, action, outcome)"
        " VALUES ($1, $2, 'delete_result', 'EXPIRED')",
        operation_id,
        owner_id,
    )


async def purge(conn: asyncpg.Connection, *, retention_seconds: int, limit: int) -> int:
    """Delete ended operations created more than ``retention_seconds`` ago, with their idempotency keys
    and artifacts (cascade) and outbox rows; return how many operations went. Frees their keys (5.1).
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


async def stranded_operations(conn: asyncpg.Connection, *, quiet_seconds: float, limit: int) -> list[str]:
    """Operations that need a wake-up and have had none for ``quiet_seconds``: expired leases, due
    retries, and QUEUED ones whose message was lost.
    """
    rows = await conn.fetch(
        """
        SELECT o.operation_id FROM operations o
        WHERE ((o.state = 'RUNNING' AND o.lease_expires_at < now())
               OR (o.state = 'RETRY_AT' AND o.retry_at <= now())
               OR (o.state = 'QUEUED' AND o.updated_at < now() - make_interval(secs => $1)))
          AND NOT EXISTS (
              SELECT 1 FROM outbox b WHERE b.operation_id = o.operation_id
                AND (b.published_at IS NULL OR b.published_at > now() - make_interval(secs => $1)))
        ORDER BY o.updated_at LIMIT $2
        """,
        quiet_seconds,
        limit,
    )
    return [row["operation_id"] for row in rows]


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


async def finish_abandoned_cancel(conn: asyncpg.Connection, *, operation_id: str, generation: int) -> bool:
    """CANCEL_REQUESTED -> CANCELED, unless a worker took a lease on it meanwhile."""
    status = await conn.execute(
        """
        UPDATE operations SET state = 'CANCELED', progress_phase = 'canceled', lease_owner = NULL,
            lease_expires_at = NULL, finished_at = now(), updated_at = now()
        WHERE operation_id = $1 AND generation = $2 AND state = 'CANCEL_REQUESTED'
          AND (lease_expires_at IS NULL OR lease_expires_at < now())
        """,
        operation_id,
        generation,
    )
    return status == "UPDATE 1"
