"""The work queue's deliveries: a wake-up names an operation, whose lease is claimed together with the
owner's membership; the claim decides whether to run the export, refuse it or finish its cancel
(docs/states.md: States and failure model, Operation).
"""

from __future__ import annotations

import dataclasses
import logging
from enum import Enum

import asyncpg
from aio_pika.abc import AbstractIncomingMessage

from services.worker import metrics
from services.worker.operation.runner import LeaseRunner
from services.worker.queue.consumer import NotClaimed, claim_or_requeue, decode_payload
from shared import tracing
from shared.ids import is_operation_id
from shared.repository import leases
from shared.repository.leases import ClaimedOperation, current_state
from shared.settings import WorkerPartSettings
from shared.storage import ARTIFACT_KEY_SUFFIXES, artifact_key_stem

log = logging.getLogger(__name__)

WORKER_LOST_MESSAGE = (
    "Every attempt of this export stopped without finishing (its worker was lost); an operator must look"
    " into it and requeue it."
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OperationDeliveries:
    """The work queue's deliveries, ``{"operation_id": ...}``: claim the operation's lease and check
    membership, then run, refuse or finish the cancel of the export with ``runner``.
    """

    what = "export"
    pool: asyncpg.Pool
    runner: LeaseRunner
    settings: WorkerPartSettings
    worker_id: str

    def decode(self, body: bytes) -> str | None:
        """The operation a wake-up names, or None for anything that is not ``{"operation_id": <id>}``."""
        payload = decode_payload(body)
        value = payload.get("operation_id") if payload is not None else None
        return value if isinstance(value, str) and is_operation_id(value) else None

    async def handle(self, message: AbstractIncomingMessage, operation_id: str) -> None:
        """Claim, settle ``message``, and run what the claim gave, in one span of the operation's trace (the
        broker instrumentation's receive span, from the message's headers, is its parent).
        """
        with tracing.span("export", attributes={tracing.OPERATION_ID: operation_id}):
            await self._handle(message, operation_id)

    async def _handle(self, message: AbstractIncomingMessage, operation_id: str) -> None:
        try:
            work = await claim_or_requeue(
                message,
                lambda: self._claim(operation_id),
                hand_back=self._hand_back,
                log_extra={"operation_id": operation_id},
            )
        except NotClaimed:
            return
        if work is None:
            return
        claimed, purpose = work
        tracing.set_attributes(**claimed.span_attributes(), **{"chatexport.lease_purpose": purpose.value})
        if purpose is LeasePurpose.EXPORT:
            # An export's ordinary course logs at DEBUG; a takeover is news to an operator (docs/operations.md: Logs).
            (log.info if claimed.took_over else log.debug)(
                "lease taken", extra=claimed.log_extra(worker=self.worker_id)
            )
            await self.runner.run(claimed)
        elif purpose is LeasePurpose.REFUSE:
            await self.runner.refuse(claimed)
        else:
            await self.runner.finish_cancellation(claimed)

    async def _hand_back(self, work: tuple[ClaimedOperation, LeasePurpose]) -> None:
        """Give back a lease claimed as the worker stopped: an attempt's lease at once; a cancellation's
        lease runs out, and the janitor finishes the cancel (docs/states.md: States and failure model, Cancel).
        """
        claimed, purpose = work
        if purpose is not LeasePurpose.CANCEL:
            await self.runner.hand_back(claimed)

    async def _claim(self, operation_id: str) -> tuple[ClaimedOperation, LeasePurpose] | None:
        """Claim the lease and check membership in one call (``leases.claim_export``); return the claimed
        operation with what to do with it, or None when there is nothing to do (docs/states.md: States and
        failure model, Operation).

        An operation whose every attempt lost its worker is parked in FAILED_REPAIR instead of taken over; a
        cancellation nobody holds is taken to be finished here (docs/states.md: States and failure model, Cancel).
        """
        async with self.pool.acquire() as conn:
            claim = await leases.claim_export(
                conn,
                operation_id=operation_id,
                worker_id=self.worker_id,
                lease_seconds=self.settings.lease_seconds,
                max_attempts=self.settings.max_attempts,
                message=WORKER_LOST_MESSAGE,
                key_stem=artifact_key_stem(self.settings, operation_id),
                key_suffixes=ARTIFACT_KEY_SUFFIXES,
            )
            if claim.parked:
                log.warning("export parked: every attempt lost its worker", extra={"operation_id": operation_id})
                return None
            claimed = claim.claimed
            if claimed is None:
                return await self._claim_cancellation(conn, operation_id)
        if claimed.took_over:  # counted once the claim has committed
            metrics.LEASE_TAKEOVERS.inc()
        return claimed, LeasePurpose.EXPORT if claim.member else LeasePurpose.REFUSE

    async def _claim_cancellation(
        self, conn: asyncpg.Connection, operation_id: str
    ) -> tuple[ClaimedOperation, LeasePurpose] | None:
        """The lease of a cancellation to finish; None, after logging and counting a wake-up that names no
        operation (a purged one, or one from another deployment), when there is nothing to do.
        """
        claimed = await leases.claim_cancellation(
            conn, operation_id=operation_id, worker_id=self.worker_id, lease_seconds=self.settings.lease_seconds
        )
        if claimed is not None:
            return claimed, LeasePurpose.CANCEL
        if await current_state(conn, operation_id=operation_id) is None:
            metrics.UNKNOWN_WAKEUPS.inc()
            log.warning("wake-up for an unknown operation acked", extra={"operation_id": operation_id})
        return None


class LeasePurpose(Enum):
    """What a claimed lease is for: run the export, refuse it (the owner lost access), or finish a cancel."""

    EXPORT = "export"
    REFUSE = "refuse"
    CANCEL = "cancel"
