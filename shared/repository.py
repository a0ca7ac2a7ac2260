"""SQL that several services share: the removal of artifacts (worker and janitor), the closing of an
attempt (worker and janitor), the admin requeue (API and CLI) and the readiness ping (every part). Each
function runs on the caller's connection, inside the caller's transaction if any.
"""

from __future__ import annotations

import asyncpg


async def ping(conn: asyncpg.Connection) -> None:
    """Run a trivial query; raises what the driver raises when the database cannot answer."""
    await conn.fetchval("SELECT 1")


async def start_removal(conn: asyncpg.Connection, *, operation_id: str, generation: int) -> str | None:
    """Move an artifact to REMOVING and return its object key; None when it is a served result (PUBLISHED
    and its operation not EXPIRED) or was never recorded.

    Committed before S3 is touched (contract 6): an adoption needs COMPLETE and the old holder needs
    WRITING, so neither can take the object back while it is deleted. The row lock orders this against an
    adoption's ``COMPLETE -> PUBLISHED``: whichever commits first wins.
    """
    key: str | None = await conn.fetchval(
        """
        UPDATE artifacts a SET state = 'REMOVING', updated_at = now()
        FROM operations o
        WHERE a.operation_id = o.operation_id AND a.operation_id = $1 AND a.generation = $2
          AND NOT (a.state = 'PUBLISHED' AND o.state <> 'EXPIRED')
        RETURNING a.object_key
        """,
        operation_id,
        generation,
    )
    return key


async def finish_removal(conn: asyncpg.Connection, *, operation_id: str, generation: int) -> None:
    """REMOVING -> DELETED once the object and its uploads are gone from S3."""
    await conn.execute(
        """
        UPDATE artifacts SET state = 'DELETED', updated_at = now()
        WHERE operation_id = $1 AND generation = $2 AND state = 'REMOVING'
        """,
        operation_id,
        generation,
    )


async def unremoved_artifacts(
    conn: asyncpg.Connection, *, operation_id: str, below_generation: int | None = None
) -> list[asyncpg.Record]:
    """Artifacts of ``operation_id`` (only generations below ``below_generation`` when given) that may still
    have an object or upload in S3, newest first: (generation, object_key, state, size_bytes, sha256,
    message_count).
    """
    rows: list[asyncpg.Record] = await conn.fetch(
        """
        SELECT generation, object_key, state, size_bytes, sha256, message_count FROM artifacts
        WHERE operation_id = $1 AND state <> 'DELETED' AND ($2::bigint IS NULL OR generation < $2)
        ORDER BY generation DESC
        """,
        operation_id,
        below_generation,
    )
    return rows


def closing_attempt(update: str, *, outcome: str, error_code: str = "NULL") -> str:
    """SQL of one statement that runs ``update`` (an ``UPDATE operations ...`` without RETURNING) and closes
    the open attempt of the generation it changed with ``outcome`` and ``error_code`` (SQL expressions).
    The statement selects one boolean: true when ``update`` changed the operation.

    One statement, so an attempt's history ends with the write that ends the attempt, also outside a
    transaction, and a fenced ``update`` that matches nothing closes nothing (contract 5.3).
    """
    return f"""
    WITH ended AS ({update} RETURNING operation_id, generation),
    closed AS (
        UPDATE attempts a SET ended_at = now(), outcome = {outcome}, error_code = {error_code}
        FROM ended e
        WHERE a.operation_id = e.operation_id AND a.generation = e.generation AND a.ended_at IS NULL)
    SELECT EXISTS (SELECT 1 FROM ended)
    """


async def requeue(conn: asyncpg.Connection, *, operation_id: str) -> bool:
    """FAILED_REPAIR -> QUEUED with a fresh attempt budget; False (nothing changed) from any other state.

    The generation moves on, so a worker that still holds an old lease (a frozen one, parked as
    WORKER_LOST) matches none of the fenced writes afterwards, not even those allowed while
    CANCEL_REQUESTED (contract 5.3). No attempt is open here (the write that parked the operation closed
    it), so the attempt history is left as it is; the next claim opens the new generation's attempt.
    """
    status = await conn.execute(
        """
        UPDATE operations SET state = 'QUEUED', attempt = 0, generation = generation + 1, retry_at = NULL,
            error_code = NULL, error_message = NULL, progress_phase = NULL, messages_written = 0,
            bytes_written = 0, lease_owner = NULL, lease_expires_at = NULL, finished_at = NULL, updated_at = now()
        WHERE operation_id = $1 AND state = 'FAILED_REPAIR'
        """,
        operation_id,
    )
    return status == "UPDATE 1"


async def operation_state(conn: asyncpg.Connection, *, operation_id: str) -> str | None:
    """The operation's state now; None when there is no such operation."""
    state: str | None = await conn.fetchval("SELECT state FROM operations WHERE operation_id = $1", operation_id)
    return state
