"""Consuming wake-up messages: claim the lease in Postgres, ack, then run the export in the background.

The ack follows the lease commit at once (contract 6), so a long export never sits unacked against the
broker's consumer timeout; if the worker dies after the ack, the lease expires and the janitor re-enqueues.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import asyncpg
from aio_pika.abc import AbstractIncomingMessage

from services.worker import repository as repo
from services.worker.errors import access_revoked
from services.worker.export import Lease
from services.worker.runner import LeaseRunner
from shared.settings import Settings
from shared.states import State

log = logging.getLogger(__name__)

# How long a delivery may wait for a free export slot before it goes back to the queue for another worker.
CAPACITY_WAIT_SECONDS = 30.0
# Pause before handing a delivery back when the database is unreachable, so the queue does not spin.
DATABASE_RETRY_SECONDS = 2.0

_DB_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncio.TimeoutError)


class Consumer:
    """Turns deliveries into leases; at most ``settings.worker_concurrency`` exports run at once."""

    def __init__(self, *, pool: asyncpg.Pool, runner: LeaseRunner, settings: Settings, worker_id: str) -> None:
        self._pool = pool
        self._runner = runner
        self._settings = settings
        self._worker_id = worker_id
        self._slots = asyncio.Semaphore(settings.worker_concurrency)
        self.running: set[asyncio.Task[None]] = set()

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        """Handle one delivery; every path acks, rejects or requeues it."""
        operation_id = _operation_id(message.body)
        if operation_id is None:
            log.error("undecodable message dead-lettered", extra={"message_id": message.message_id})
            await message.reject(requeue=False)
            return
        try:
            await asyncio.wait_for(self._slots.acquire(), CAPACITY_WAIT_SECONDS)
        except TimeoutError:
            await message.nack(requeue=True)
            return
        task = asyncio.create_task(self._claim_and_run(message, operation_id), name=f"export-{operation_id}")
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        task.add_done_callback(lambda _: self._slots.release())

    async def _claim_and_run(self, message: AbstractIncomingMessage, operation_id: str) -> None:
        try:
            lease = await self._claim(operation_id)
        except _DB_ERRORS:
            log.warning("claim failed; message requeued", extra={"operation_id": operation_id})
            await asyncio.sleep(DATABASE_RETRY_SECONDS)
            await _settle(message, requeue=True)
            return
        await _settle(message, requeue=False)
        if lease is not None:
            log.info("lease taken", extra=lease.log_extra(worker=self._worker_id))
            await self._runner.run(lease)

    async def _claim(self, operation_id: str) -> Lease | None:
        """Claim and check membership in one transaction; a non-member's export ends FAILED at once (5.7)."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await repo.claim(
                conn,
                operation_id=operation_id,
                worker_id=self._worker_id,
                lease_seconds=self._settings.lease_seconds,
            )
            if row is None:
                return None
            lease = Lease.from_row(row)
            if await repo.holds_membership(conn, conversation_id=lease.conversation_id, user_id=lease.owner_id):
                return lease
            revoked = access_revoked()
            await repo.end_attempt(
                conn,
                operation_id=operation_id,
                generation=lease.generation,
                state=State.FAILED,
                error_code=revoked.code,
                error_message=revoked.message,
            )
            log.info("export refused at start: access revoked", extra=lease.log_extra())
            return None


async def _settle(message: AbstractIncomingMessage, *, requeue: bool) -> None:
    # After a reconnect the delivery tag belongs to a dead channel (PITFALLS): the broker redelivers the
    # message, and the lease makes the redelivery a no-op.
    with contextlib.suppress(Exception):
        if requeue:
            await message.nack(requeue=True)
        else:
            await message.ack()


def _operation_id(body: bytes) -> str | None:
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    value = payload.get("operation_id") if isinstance(payload, dict) else None
    return value if isinstance(value, str) and 0 < len(value) <= 64 else None
