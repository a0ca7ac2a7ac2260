"""All SQL of the worker. Writes of a lease holder are fenced: they match only while the operation is
RUNNING (or, for the lease itself, CANCEL_REQUESTED: the holder keeps it until it has removed its objects
and written CANCELED) under the holder's generation, so a holder that lost its lease changes nothing
(README: States and failure model). A claim opens the generation's row in ``attempts`` and every write
that ends an attempt closes it, in the same transaction (``shared.repository``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from shared.repository import close_attempt, close_attempt_if_matched, open_attempt, supersede_attempts

# One export line per message, rendered by Postgres so no row crosses into Python objects. to_json escapes
# exactly as json.dumps(ensure_ascii=False) does; the three replace() escape what shared.jsontext escapes
# (U+0085, U+2028, U+2029, outside JSON's own escapes), so every line is one line for every reader and the
# file matches the read API byte for byte (README: API reference, The file).
# sent_at is printed as shared.timefmt prints timestamps in the API.
EXPORT_LINES_SQL = """
SELECT replace(replace(replace(
    '{"conversation_id":' || to_json(conversation_id)::text
    || ',"seq":' || seq
    || ',"message_id":' || to_json(message_id)::text
    || ',"sender_id":' || to_json(sender_id)::text
    || ',"sent_at":"' || to_char(sent_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') || '"'
    || ',"body":' || to_json(body)::text || '}',
    chr(133), '\\u0085'), chr(8232), '\\u2028'), chr(8233), '\\u2029')
FROM messages
WHERE conversation_id = $1 AND seq > $2 AND seq <= $3 AND recalled_at IS NULL
ORDER BY seq
"""

# COPY's csv format with quote and delimiter characters that JSON text never contains passes the
# lines through verbatim; the text format would double every backslash.
_COPY_OPTIONS: dict[str, Any] = {"format": "csv", "quote": "\x01", "delimiter": "\x02"}


async def copy_export_lines(
    conn: asyncpg.Connection,
    *,
    conversation_id: str,
    after_seq: int,
    last_seq: int,
    output: Callable[[bytes], Awaitable[None]],
) -> None:
    """Stream the export lines of seqs ``after_seq < seq <= last_seq`` to ``output`` as raw bytes.

    One short statement: no snapshot stays open across the export (a snapshot held open holds back vacuum
    of every table, the outbox included).
    """
    await conn.copy_from_query(EXPORT_LINES_SQL, conversation_id, after_seq, last_seq, output=output, **_COPY_OPTIONS)


async def claim(
    conn: asyncpg.Connection, *, operation_id: str, worker_id: str, lease_seconds: float
) -> dict[str, Any] | None:
    """Take the lease of a runnable operation with generation + 1; None when there is nothing to run.

    Runnable: QUEUED, RETRY_AT whose time has come, or RUNNING whose lease expired (a takeover). Times are
    the database's. ``snapshot_max_seq``, the highest seq the file may hold, is fixed on the first claim and
    kept by every retry: the conversation's last seq, capped at ``before_seq - 1``, and ``after_seq`` when
    that leaves the range empty, so that an export of what came next starts there (README: API reference). The
    same transaction opens the new generation's attempt, held by ``worker_id``, and closes an older one
    still open (``shared.repository.supersede_attempts``). Returns the claimed row (operation_id, owner_id,
    conversation_id, before_seq, after_seq, snapshot_max_seq, generation, attempt) with ``took_over``,
    whether the claim was a takeover.
    """
    async with conn.transaction():
        row = await conn.fetchrow(
            """
            UPDATE operations o SET
                state = 'RUNNING', generation = o.generation + 1, attempt = o.attempt + 1,
                lease_owner = $2, lease_expires_at = now() + make_interval(secs => $3),
                snapshot_max_seq = coalesce(o.snapshot_max_seq, greatest(o.after_seq, least(
                    (SELECT c.last_seq FROM conversations c WHERE c.conversation_id = o.conversation_id),
                    o.before_seq - 1))),
                progress_phase = 'starting', messages_written = 0, bytes_written = 0,
                retry_at = NULL, error_code = NULL, error_message = NULL, updated_at = now()
            WHERE o.operation_id = $1 AND (
                o.state = 'QUEUED'
                OR (o.state = 'RETRY_AT' AND o.retry_at <= now())
                OR (o.state = 'RUNNING' AND o.lease_expires_at < now()))
            RETURNING o.operation_id, o.owner_id, o.conversation_id, o.before_seq, o.after_seq,
                      o.snapshot_max_seq, o.generation, o.attempt
            """,
            operation_id,
            worker_id,
            lease_seconds,
        )
        if row is None:
            return None
        took_over = await supersede_attempts(conn, operation_id=operation_id, generation=row["generation"])
        await open_attempt(
            conn, operation_id=operation_id, generation=row["generation"], attempt=row["attempt"], worker_id=worker_id
        )
    return {**row, "took_over": took_over}


async def claim_cancellation(
    conn: asyncpg.Connection, *, operation_id: str, worker_id: str, lease_seconds: float
) -> asyncpg.Record | None:
    """Take the lease of a CANCEL_REQUESTED operation that no live worker holds (never claimed, waiting for
    a retry, or its holder's lease expired), with generation + 1, so that this worker removes what earlier
    generations left and writes CANCELED without waiting for a janitor pass (README: States and failure
    model, Cancel). None when a live holder will finish it itself or it is in another state.

    No attempt is opened (it exports nothing and ``attempt`` stays); an attempt still open for an older
    generation is closed as LEASE_LOST, as a takeover closes it. Returns the columns of ``claim`` (with
    ``snapshot_max_seq`` = ``after_seq`` when it was never fixed).
    """
    async with conn.transaction():
        row = await conn.fetchrow(
            """
            UPDATE operations o SET generation = o.generation + 1, lease_owner = $2,
                lease_expires_at = now() + make_interval(secs => $3)
            WHERE o.operation_id = $1 AND o.state = 'CANCEL_REQUESTED'
              AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
            RETURNING o.operation_id, o.owner_id, o.conversation_id, o.before_seq, o.after_seq,
                      coalesce(o.snapshot_max_seq, o.after_seq) AS snapshot_max_seq, o.generation, o.attempt
            """,
            operation_id,
            worker_id,
            lease_seconds,
        )
        if row is not None:
            await supersede_attempts(conn, operation_id=operation_id, generation=row["generation"])
    return row


async def park_abandoned(conn: asyncpg.Connection, *, operation_id: str, max_attempts: int, message: str) -> bool:
    """RUNNING -> FAILED_REPAIR when its lease expired after ``max_attempts`` attempts: each of them lost its worker, so
    taking it over again would only risk the next one (README: States and failure model: the budget is spent). The last
    attempt is closed as LEASE_LOST with ``WORKER_LOST``.
    """
    async with conn.transaction():
        generation = await conn.fetchval(
            """
            UPDATE operations SET state = 'FAILED_REPAIR', error_code = 'WORKER_LOST', error_message = $3,
                progress_phase = 'failed_repair', lease_owner = NULL, lease_expires_at = NULL,
                finished_at = now(), updated_at = now()
            WHERE operation_id = $1 AND state = 'RUNNING' AND lease_expires_at < now() AND attempt >= $2
            RETURNING generation
            """,
            operation_id,
            max_attempts,
            message,
        )
        if generation is None:
            return False
        await close_attempt(
            conn, operation_id=operation_id, generation=generation, outcome="LEASE_LOST", error_code="WORKER_LOST"
        )
    return True


async def holds_membership(conn: asyncpg.Connection, *, conversation_id: str, user_id: str) -> bool:
    """True when ``user_id`` is a member; the row is share-locked so a removal waits for this transaction.

    That makes "still a member" and "commit SUCCEEDED" one atomic decision (README: States and failure model).
    """
    found = await conn.fetchval(
        "SELECT 1 FROM conversation_members WHERE conversation_id = $1 AND user_id = $2 FOR SHARE",
        conversation_id,
        user_id,
    )
    return found is not None


async def extend_lease(conn: asyncpg.Connection, *, operation_id: str, generation: int, lease_seconds: float) -> bool:
    """Heartbeat: push the lease end to now + ``lease_seconds``; False when the lease is no longer held.

    Also while CANCEL_REQUESTED: the holder still has objects to remove before CANCELED (README: States and failure
    model, Cancel).
    """
    status = await conn.execute(
        """
        UPDATE operations SET lease_expires_at = now() + make_interval(secs => $3)
        WHERE operation_id = $1 AND generation = $2 AND state IN ('RUNNING', 'CANCEL_REQUESTED')
        """,
        operation_id,
        generation,
        lease_seconds,
    )
    return status == "UPDATE 1"


async def record_progress(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    generation: int,
    phase: str,
    messages_written: int,
    bytes_written: int,
    lease_seconds: float,
) -> bool:
    """Store measured progress and extend the lease; False when the lease is no longer held."""
    status = await conn.execute(
        """
        UPDATE operations SET progress_phase = $3, messages_written = $4, bytes_written = $5,
            lease_expires_at = now() + make_interval(secs => $6), updated_at = now()
        WHERE operation_id = $1 AND generation = $2 AND state = 'RUNNING'
        """,
        operation_id,
        generation,
        phase,
        messages_written,
        bytes_written,
        lease_seconds,
    )
    return status == "UPDATE 1"


async def record_artifact(conn: asyncpg.Connection, *, operation_id: str, generation: int, object_key: str) -> bool:
    """Record the artifact key before its first byte is uploaded (README: How it works); False without the lease."""
    status = await conn.execute(
        """
        INSERT INTO artifacts (operation_id, generation, object_key, state)
        SELECT $1, $2, $3, 'WRITING' FROM operations
        WHERE operation_id = $1 AND generation = $2 AND state = 'RUNNING'
        """,
        operation_id,
        generation,
        object_key,
    )
    return status == "INSERT 0 1"


async def record_upload_id(conn: asyncpg.Connection, *, operation_id: str, generation: int, upload_id: str) -> None:
    """Remember the multipart upload of an artifact, for operators; clean-up lists uploads by key anyway."""
    await conn.execute(
        "UPDATE artifacts SET upload_id = $3, updated_at = now() WHERE operation_id = $1 AND generation = $2",
        operation_id,
        generation,
        upload_id,
    )


async def complete_artifact(
    conn: asyncpg.Connection, *, operation_id: str, generation: int, size_bytes: int, sha256: str, message_count: int
) -> bool:
    """WRITING -> COMPLETE with the verified figures; False when the record moved on (a newer generation
    removed this attempt's object, so it may never be published or adopted).
    """
    status = await conn.execute(
        """
        UPDATE artifacts SET state = 'COMPLETE', size_bytes = $3, sha256 = $4, message_count = $5, updated_at = now()
        WHERE operation_id = $1 AND generation = $2 AND state = 'WRITING'
        """,
        operation_id,
        generation,
        size_bytes,
        sha256,
        message_count,
    )
    return status == "UPDATE 1"


async def publish_artifact(conn: asyncpg.Connection, *, operation_id: str, generation: int) -> bool:
    """COMPLETE -> PUBLISHED, in the SUCCEEDED transaction; False when the artifact was removed meanwhile.

    The row lock this takes orders it against ``shared.artifacts.remove_artifact``.
    """
    status = await conn.execute(
        """
        UPDATE artifacts SET state = 'PUBLISHED', updated_at = now()
        WHERE operation_id = $1 AND generation = $2 AND state = 'COMPLETE'
        """,
        operation_id,
        generation,
    )
    return status == "UPDATE 1"


async def succeed(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    generation: int,
    object_key: str,
    size_bytes: int,
    sha256: str,
    message_count: int,
    result_ttl_seconds: int,
) -> bool:
    """RUNNING -> SUCCEEDED with the published key; False when the lease or the state moved on.

    A committed CANCEL_REQUESTED makes this match nothing, so SUCCEEDED can never follow it (README: States and failure
    model, Cancel). Closes the attempt as SUCCEEDED.
    """
    async with conn.transaction():
        status = await conn.execute(
            """
            UPDATE operations SET state = 'SUCCEEDED', result_key = $3, result_size_bytes = $4,
                result_sha256 = $5, result_message_count = $6,
                result_expires_at = now() + make_interval(secs => $7),
                progress_phase = 'done', messages_written = $6, bytes_written = $4,
                lease_owner = NULL, lease_expires_at = NULL, finished_at = now(), updated_at = now()
            WHERE operation_id = $1 AND generation = $2 AND state = 'RUNNING'
            """,
            operation_id,
            generation,
            object_key,
            size_bytes,
            sha256,
            message_count,
            float(result_ttl_seconds),
        )
        return await close_attempt_if_matched(
            status, conn, operation_id=operation_id, generation=generation, outcome="SUCCEEDED"
        )


async def end_attempt(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    generation: int,
    state: str,
    error_code: str,
    error_message: str,
    retry_delay_seconds: float | None = None,
) -> bool:
    """RUNNING -> FAILED, FAILED_REPAIR or RETRY_AT (with ``retry_delay_seconds``) and a readable error; the
    attempt is closed with that state as its outcome and ``error_code``.
    """
    async with conn.transaction():
        status = await conn.execute(
            """
            UPDATE operations SET state = $3, error_code = $4, error_message = $5,
                retry_at = CASE WHEN $6::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => $6) END,
                progress_phase = lower($3), lease_owner = NULL, lease_expires_at = NULL, updated_at = now(),
                finished_at = CASE WHEN $3 = 'RETRY_AT' THEN NULL ELSE now() END
            WHERE operation_id = $1 AND generation = $2 AND state = 'RUNNING'
            """,
            operation_id,
            generation,
            state,
            error_code,
            error_message,
            retry_delay_seconds,
        )
        return await close_attempt_if_matched(
            status, conn, operation_id=operation_id, generation=generation, outcome=state, error_code=error_code
        )


async def hand_back(conn: asyncpg.Connection, *, operation_id: str, generation: int) -> bool:
    """End our lease now, on a graceful stop, so another worker can take over at once (generation + 1).

    The interrupted attempt does not count against the retry budget: the next claim runs it again. The
    attempt is closed as HANDED_BACK.
    """
    async with conn.transaction():
        status = await conn.execute(
            """
            UPDATE operations SET lease_expires_at = now() - interval '1 millisecond',
                progress_phase = 'handed back', attempt = attempt - 1, updated_at = now()
            WHERE operation_id = $1 AND generation = $2 AND state IN ('RUNNING', 'CANCEL_REQUESTED')
            """,
            operation_id,
            generation,
        )
        return await close_attempt_if_matched(
            status, conn, operation_id=operation_id, generation=generation, outcome="HANDED_BACK"
        )
