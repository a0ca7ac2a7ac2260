"""Putting a parked operation back to work: the admin requeue (docs/api.md: Administration,
Admin requeue; docs/states.md: States and failure model, FAILED_REPAIR, for operators).

Shared by ``POST /admin/operations/{id}/requeue`` and ``chatexport requeue``, so both make the same change.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from shared.repository import leases, status_monitor
from shared.repository.outbox import enqueue_run


@dataclass(frozen=True)
class Requeue:
    """What a requeue found: ``state`` is the operation's state afterwards (None: no such operation)."""

    requeued: bool
    state: str | None


async def requeue(conn: asyncpg.Connection, *, operation_id: str) -> Requeue:
    """FAILED_REPAIR -> QUEUED with a fresh attempt budget, a new generation and a wake-up in the outbox,
    in one transaction. Any other state is left alone and reported. Raises the database's errors.
    """
    async with conn.transaction():
        if await status_monitor.requeue(conn, operation_id=operation_id):
            await enqueue_run(conn, operation_id=operation_id)
            return Requeue(requeued=True, state="QUEUED")
        now = await leases.current_state(conn, operation_id=operation_id)
    return Requeue(requeued=False, state=None if now is None else now.state)
