"""Putting a parked operation back to work: the admin requeue (contract 5.3, FAILED_REPAIR -> QUEUED).

Shared by ``POST /admin/operations/{id}/requeue`` and ``chatexport requeue``, so both make the same change.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from shared.outbox import enqueue_run

# A fresh attempt budget; the generation is kept, so every later lease still fences out older holders.
_REQUEUE_SQL = """
UPDATE operations SET state = 'QUEUED', attempt = 0, retry_at = NULL, error_code = NULL, error_message = NULL,
    progress_phase = NULL, messages_written = 0, bytes_written = 0, lease_owner = NULL, lease_expires_at = NULL,
    finished_at = NULL, updated_at = now()
WHERE operation_id = $1 AND state = 'FAILED_REPAIR'
"""


@dataclass(frozen=True)
class Requeue:
    """What a requeue found: ``state`` is the operation's state afterwards (None: no such operation)."""

    requeued: bool
    state: str | None


async def requeue(conn: asyncpg.Connection, *, operation_id: str) -> Requeue:
    """FAILED_REPAIR -> QUEUED with a fresh attempt budget and a wake-up in the outbox, in one transaction.

    Any other state is left alone and reported. Raises the database's errors.
    """
    async with conn.transaction():
        if await conn.execute(_REQUEUE_SQL, operation_id) == "UPDATE 1":
            await enqueue_run(conn, operation_id=operation_id)
            return Requeue(requeued=True, state="QUEUED")
        state = await conn.fetchval("SELECT state FROM operations WHERE operation_id = $1", operation_id)
    return Requeue(requeued=False, state=state)
