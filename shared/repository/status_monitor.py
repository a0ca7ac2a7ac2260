"""The status monitor's side of the ``operations`` table: the API's reads of an operation and the two
requests that change one from outside a lease, the owner's cancel and the admin's requeue (docs/api.md: API
reference; docs/states.md: States and failure model).

Reads return typed rows of the representation's view (``OperationView``). Each write is one conditional
``UPDATE`` whose ``WHERE`` names the states it leaves (``shared.states``), so a request that lost a race
matches nothing. Every function runs on the caller's connection, in the caller's transaction if any.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg

from shared.repository.operation_view import (
    REPRESENTATION_COLUMNS,
    REPRESENTATION_VIEW,
    STAMP_COLUMNS,
    OperationStamp,
    OperationView,
    select_list,
)
from shared.states import State, sources_of


async def read_operation(conn: asyncpg.Connection, *, operation_id: str, owner_id: str | None) -> OperationView | None:
    """The operation if it exists AND belongs to ``owner_id`` (one 404 for both, docs/api.md: API reference), or
    whoever owns it when ``owner_id`` is None (the admin view); None otherwise.
    """
    row = await conn.fetchrow(_READ_OPERATION, operation_id, owner_id)
    return None if row is None else OperationView.from_row(row)


_READ_OPERATION = f"""
    SELECT {select_list(REPRESENTATION_COLUMNS)} FROM {REPRESENTATION_VIEW}
    WHERE operation_id = $1 AND ($2::text IS NULL OR owner_id = $2)
"""


async def read_operation_stamp(conn: asyncpg.Connection, *, operation_id: str, owner_id: str) -> OperationStamp | None:
    """``read_operation``'s answer for ``owner_id`` narrowed to an ``OperationStamp``: None when the operation
    is missing or someone else's.
    """
    row = await conn.fetchrow(_READ_STAMP, operation_id, owner_id)
    return None if row is None else OperationStamp(*row)


_READ_STAMP = f"""
    SELECT {select_list(STAMP_COLUMNS)} FROM {REPRESENTATION_VIEW}
    WHERE operation_id = $1 AND owner_id = $2
"""


async def stored_traceparent(conn: asyncpg.Connection, *, operation_id: str, owner_id: str) -> str | None:
    """The trace context stored with ``owner_id``'s operation by its submit (docs/monitoring.md: Monitoring, Traces);
    None when there is none, or no such operation of theirs.
    """
    value: str | None = await conn.fetchval(
        "SELECT traceparent FROM operations WHERE operation_id = $1 AND owner_id = $2", operation_id, owner_id
    )
    return value


async def read_operations(
    conn: asyncpg.Connection,
    *,
    owner_id: str | None,
    state: str | None,
    limit: int,
    after: tuple[datetime, str] | None,
    conversation_id: str | None = None,
) -> list[OperationView]:
    """Up to ``limit`` operations, newest first, strictly after the keyset ``after`` (the (created_at,
    operation_id) of the last row of the previous page): those of ``owner_id``, in ``state`` and of
    ``conversation_id``, a None filter admitting every value (the user's list passes its owner, the admin
    list any).
    """
    after_created, after_id = after if after else (None, None)
    rows = await conn.fetch(
        _READ_OPERATIONS,
        owner_id,
        state,
        conversation_id,
        after_created,
        after_id,
        limit,
    )
    return [OperationView.from_row(row) for row in rows]


_READ_OPERATIONS = f"""
    SELECT {select_list(REPRESENTATION_COLUMNS)} FROM {REPRESENTATION_VIEW}
    WHERE ($1::text IS NULL OR owner_id = $1)
      AND ($2::text IS NULL OR state = $2)
      AND ($3::text IS NULL OR conversation_id = $3)
      AND ($4::timestamptz IS NULL OR (created_at, operation_id) < ($4, $5))
    ORDER BY created_at DESC, operation_id DESC
    LIMIT $6
"""


async def request_cancel(conn: asyncpg.Connection, *, operation_id: str, owner_id: str) -> bool:
    """Move a QUEUED, RUNNING or RETRY_AT operation of ``owner_id`` to CANCEL_REQUESTED; False when it was
    not moved (unknown, not the owner's, or in another state).

    One conditional UPDATE (docs/states.md: States and failure model): it cannot overtake a SUCCEEDED that committed
    first, and once it commits the worker's conditional SUCCEEDED update can no longer match. A retry's error
    goes: it no longer describes what happens next (an operation shows ``error`` only in RETRY_AT, FAILED and
    FAILED_REPAIR, docs/api.md: API reference).
    """
    status = await conn.execute(
        """
        UPDATE operations SET state = 'CANCEL_REQUESTED', updated_at = now(), retry_at = NULL,
            error_code = NULL, error_message = NULL
        WHERE operation_id = $1 AND owner_id = $2 AND state = ANY($3::text[])
        """,
        operation_id,
        owner_id,
        sources_of(State.CANCEL_REQUESTED),
    )
    return status == "UPDATE 1"


async def requeue(conn: asyncpg.Connection, *, operation_id: str) -> bool:
    """FAILED_REPAIR -> QUEUED with a fresh attempt budget; False (nothing changed) from any other state.

    The generation moves on, so a worker that still holds an old lease (a frozen one, parked as WORKER_LOST) matches
    none of the fenced writes afterwards, not even those allowed while CANCEL_REQUESTED (docs/states.md: States and
    failure model). No attempt is open here (the write that parked the operation closed it), so the attempt history is
    left as it is; the next claim opens the new generation's attempt.
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
