"""SQL that several services share: the removal of artifacts (worker and janitor), the closing of an
attempt (worker and janitor), the admin requeue (API and CLI) and the readiness ping (every part). Each
function runs on the caller's connection, inside the caller's transaction if any.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from shared.states import State


async def ping(conn: asyncpg.Connection) -> None:
    """Run a trivial query; raises what the driver raises when the database cannot answer."""
    await conn.fetchval("SELECT 1")


async def start_removal(conn: asyncpg.Connection, *, operation_id: str, generation: int) -> str | None:
    """Move an artifact to REMOVING and return its object key; None when it is a served result (PUBLISHED
    and its operation not EXPIRED) or was never recorded.

    Committed before S3 is touched (README: How it works): an adoption needs COMPLETE and the old holder needs
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


async def supersede_attempts(conn: asyncpg.Connection, *, operation_id: str, generation: int) -> bool:
    """Close as LEASE_LOST every attempt of a generation below ``generation`` still open: its holder can no
    longer end it, every write of its generation being fenced off. Returns True when it closed one (the
    claim that moved to ``generation`` was a takeover). Run it in that claim's transaction.
    """
    status = await conn.execute(
        """
        UPDATE attempts SET ended_at = now(), outcome = 'LEASE_LOST'
        WHERE operation_id = $1 AND generation < $2 AND ended_at IS NULL
        """,
        operation_id,
        generation,
    )
    return status != "UPDATE 0"


async def open_attempt(
    conn: asyncpg.Connection, *, operation_id: str, generation: int, attempt: int, worker_id: str
) -> None:
    """Record the attempt of ``generation`` (``attempt``, 1-based) held by ``worker_id``, in its claim's
    transaction (README: Attempts).
    """
    await conn.execute(
        "INSERT INTO attempts (operation_id, generation, attempt, worker_id) VALUES ($1, $2, $3, $4)",
        operation_id,
        generation,
        attempt,
        worker_id,
    )


async def close_attempt(
    conn: asyncpg.Connection, *, operation_id: str, generation: int, outcome: str, error_code: str | None = None
) -> None:
    """Close the open attempt of ``generation`` with ``outcome`` (a state it ended in, ``HANDED_BACK`` or
    ``LEASE_LOST``) and ``error_code``; an attempt already closed, or none, is left as it is. Run it in the
    transaction of the write that ended the attempt, so that the history ends with it (README: Attempts).
    """
    await conn.execute(
        """
        UPDATE attempts SET ended_at = now(), outcome = $3, error_code = $4
        WHERE operation_id = $1 AND generation = $2 AND ended_at IS NULL
        """,
        operation_id,
        generation,
        outcome,
        error_code,
    )


async def close_attempt_if_matched(
    status: str,
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    generation: int,
    outcome: str,
    error_code: str | None = None,
) -> bool:
    """After a fenced ``UPDATE`` of one operation whose command ``status`` tells whether it matched, close
    the attempt of ``generation`` it ended (``close_attempt``); return whether it matched.
    """
    if status != "UPDATE 1":
        return False
    await close_attempt(conn, operation_id=operation_id, generation=generation, outcome=outcome, error_code=error_code)
    return True


async def finish_cancel(conn: asyncpg.Connection, *, operation_id: str, generation: int, abandoned: bool) -> bool:
    """CANCEL_REQUESTED -> CANCELED once every object is gone (README: States and failure model, Cancel);
    False when the operation moved on. By the holder of ``generation`` (its attempt closed as CANCELED), or,
    ``abandoned``, by the janitor for a cancellation nobody holds: then only while no live lease exists (a
    worker that took one finishes it itself) and an attempt still open, whose worker was lost, is closed as
    LEASE_LOST.
    """
    async with conn.transaction():
        status = await conn.execute(
            """
            UPDATE operations SET state = 'CANCELED', progress_phase = 'canceled', lease_owner = NULL,
                lease_expires_at = NULL, finished_at = now(), updated_at = now()
            WHERE operation_id = $1 AND generation = $2 AND state = 'CANCEL_REQUESTED'
              AND (NOT $3 OR lease_expires_at IS NULL OR lease_expires_at < now())
            """,
            operation_id,
            generation,
            abandoned,
        )
        outcome = "LEASE_LOST" if abandoned else "CANCELED"
        return await close_attempt_if_matched(
            status, conn, operation_id=operation_id, generation=generation, outcome=outcome
        )


async def requeue(conn: asyncpg.Connection, *, operation_id: str) -> bool:
    """FAILED_REPAIR -> QUEUED with a fresh attempt budget; False (nothing changed) from any other state.

    The generation moves on, so a worker that still holds an old lease (a frozen one, parked as WORKER_LOST) matches
    none of the fenced writes afterwards, not even those allowed while CANCEL_REQUESTED (README: States and failure
    model). No attempt is open here (the write that parked the operation closed it), so the attempt history is left as
    it is; the next claim opens the new generation's attempt.
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


@dataclass(frozen=True)
class CurrentState:
    """Where an operation is now: its ``state`` and the fencing ``generation`` of its current or last lease."""

    state: State
    generation: int


async def current_state(conn: asyncpg.Connection, *, operation_id: str) -> CurrentState | None:
    """The operation's state and generation now; None when there is no such operation. Tells why a fenced
    write matched nothing, or whether a requeue may apply.
    """
    row = await conn.fetchrow("SELECT state, generation FROM operations WHERE operation_id = $1", operation_id)
    return None if row is None else CurrentState(State(row["state"]), row["generation"])


async def record_access_event(
    conn: asyncpg.Connection, *, operation_id: str, user_id: str, action: str, outcome: str
) -> None:
    """Record who did ``action`` (``download``, ``delete_result``) on which operation and its ``outcome``
    (README: API reference, Access events). Run it in the transaction of what it records, if any.
    """
    await conn.execute(
        "INSERT INTO access_events (operation_id, user_id, action, outcome) VALUES ($1, $2, $3, $4)",
        operation_id,
        user_id,
        action,
        outcome,
    )
