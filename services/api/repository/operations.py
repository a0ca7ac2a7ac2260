"""SQL of the export operations as the API sees them: submit, read, list, cancel, access events."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from shared.fingerprint import ExportRequest
from shared.states import ACTIVE, State, sources_of

# Columns of the operation representation (README: API reference) plus the database's view of its age;
# ``finished_at`` is when a SUCCEEDED result was published, its download's Last-Modified.
OPERATION_COLUMNS = """
    o.operation_id, o.kind, o.owner_id, o.conversation_id, o.format, o.before_seq, o.after_seq, o.state,
    o.created_at, o.updated_at, o.attempt, o.generation, o.progress_phase, o.messages_written,
    o.bytes_written, o.snapshot_max_seq, o.retry_at, o.error_code, o.error_message, o.result_key,
    o.result_size_bytes, o.result_sha256, o.result_message_count, o.result_expires_at, o.finished_at,
    extract(epoch FROM now() - o.created_at)::float8 AS age_seconds
"""

_ACTIVE_STATES = sorted(state.value for state in ACTIVE)


async def lock_owner(conn: asyncpg.Connection, *, owner_id: str) -> None:
    """Serialise submissions of one user until the transaction ends.

    Makes "idempotency lookup, quota count, insert" atomic per user, so concurrent identical requests
    yield one operation and concurrent different ones cannot overrun the quota (README: API reference, Submit).
    """
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('submit:' || $1, 0))", owner_id)


async def find_idempotency_key(
    conn: asyncpg.Connection, *, owner_id: str, idempotency_key: str, replay_window_seconds: int
) -> asyncpg.Record | None:
    """The remembered use of ``idempotency_key`` by ``owner_id``: fingerprint, operation_id, expired."""
    return await conn.fetchrow(
        """
        SELECT fingerprint, operation_id,
               created_at + make_interval(secs => $3) <= now() AS expired
        FROM idempotency_keys WHERE owner_id = $1 AND idempotency_key = $2
        """,
        owner_id,
        idempotency_key,
        float(replay_window_seconds),
    )


async def count_active(conn: asyncpg.Connection, *, owner_id: str) -> int:
    """How many of ``owner_id``'s operations are not terminal (the 429 quota; README: API reference, Submit)."""
    count: int = await conn.fetchval(
        "SELECT count(*) FROM operations WHERE owner_id = $1 AND state = ANY($2::text[])",
        owner_id,
        _ACTIVE_STATES,
    )
    return count


async def insert_operation(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    owner_id: str,
    conversation_id: str,
    request: ExportRequest,
) -> None:
    """Store a new QUEUED operation (the outbox row and idempotency record go in the same transaction)."""
    await conn.execute(
        """
        INSERT INTO operations (operation_id, owner_id, conversation_id, format, before_seq, after_seq, state)
        VALUES ($1, $2, $3, $4, $5, $6, 'QUEUED')
        """,
        operation_id,
        owner_id,
        conversation_id,
        request.format,
        request.before_seq,
        request.after_seq,
    )


async def insert_idempotency_key(
    conn: asyncpg.Connection, *, owner_id: str, idempotency_key: str, fingerprint: str, operation_id: str
) -> None:
    """Remember ``idempotency_key`` of ``owner_id`` for the operation it created."""
    await conn.execute(
        """
        INSERT INTO idempotency_keys (owner_id, idempotency_key, fingerprint, operation_id)
        VALUES ($1, $2, $3, $4)
        """,
        owner_id,
        idempotency_key,
        fingerprint,
        operation_id,
    )


async def get_operation(conn: asyncpg.Connection, *, operation_id: str, owner_id: str | None) -> asyncpg.Record | None:
    """The operation if it exists AND belongs to ``owner_id`` (one 404 for both, README: API reference), or
    whoever owns it when ``owner_id`` is None (the admin view); None otherwise. Rows carry
    ``OPERATION_COLUMNS`` and the lease (lease_owner, lease_expires_at).
    """
    return await conn.fetchrow(
        f"""
        SELECT {OPERATION_COLUMNS}, o.lease_owner, o.lease_expires_at FROM operations o
        WHERE o.operation_id = $1 AND ($2::text IS NULL OR o.owner_id = $2)
        """,
        operation_id,
        owner_id,
    )


async def list_operations(
    conn: asyncpg.Connection,
    *,
    owner_id: str | None,
    state: str | None,
    limit: int,
    after: tuple[datetime, str] | None,
    conversation_id: str | None = None,
) -> list[asyncpg.Record]:
    """Up to ``limit`` operations, newest first, strictly after the keyset ``after`` (the (created_at,
    operation_id) of the last row of the previous page): those of ``owner_id``, in ``state`` and of
    ``conversation_id``, a None filter admitting every value (the user's list passes its owner, the admin
    list any). Rows carry ``OPERATION_COLUMNS`` and the lease (lease_owner, lease_expires_at).
    """
    after_created, after_id = after if after else (None, None)
    rows: list[asyncpg.Record] = await conn.fetch(
        f"""
        SELECT {OPERATION_COLUMNS}, o.lease_owner, o.lease_expires_at FROM operations o
        WHERE ($1::text IS NULL OR o.owner_id = $1)
          AND ($2::text IS NULL OR o.state = $2)
          AND ($3::text IS NULL OR o.conversation_id = $3)
          AND ($4::timestamptz IS NULL OR (o.created_at, o.operation_id) < ($4, $5))
        ORDER BY o.created_at DESC, o.operation_id DESC
        LIMIT $6
        """,
        owner_id,
        state,
        conversation_id,
        after_created,
        after_id,
        limit,
    )
    return rows


async def request_cancel(conn: asyncpg.Connection, *, operation_id: str, owner_id: str) -> asyncpg.Record | None:
    """Move a QUEUED, RUNNING or RETRY_AT operation to CANCEL_REQUESTED; return it, or None if not moved.

    One conditional UPDATE (README: States and failure model): it cannot overtake a SUCCEEDED that committed first, and
    once it commits the worker's conditional SUCCEEDED update can no longer match. A retry's error goes: it no longer
    describes what happens next (5.2 shows ``error`` only in RETRY_AT, FAILED, FAILED_REPAIR).
    """
    return await conn.fetchrow(
        f"""
        UPDATE operations o SET state = 'CANCEL_REQUESTED', updated_at = now(), retry_at = NULL,
            error_code = NULL, error_message = NULL
        WHERE o.operation_id = $1 AND o.owner_id = $2 AND o.state = ANY($3::text[])
        RETURNING {OPERATION_COLUMNS}
        """,
        operation_id,
        owner_id,
        sources_of(State.CANCEL_REQUESTED),
    )
