"""Running one claimed lease to its end: heartbeats while the job works, then the state the outcome
calls for (SUCCEEDED is written by the job; FAILED, RETRY_AT, FAILED_REPAIR, CANCELED here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg

from services.worker import metrics
from services.worker.errors import LeaseLost, access_revoked, classify, error_name, is_missing_bucket
from services.worker.export import ExportJob
from shared.artifact_removal import remove_artifacts
from shared.db import TRANSIENT_DATABASE_ERRORS
from shared.logs import log_fields
from shared.metrics import AUTHORIZATION_REFUSALS, CANCELLATIONS_FINISHED
from shared.phases import Phase
from shared.repository import operations
from shared.repository.operations import ClaimedOperation, CurrentState, current_state, finish_cancel
from shared.repository.outbox import enqueue_run
from shared.settings import Settings
from shared.states import State
from shared.storage import ensure_bucket

log = logging.getLogger(__name__)


class LeaseRunner:
    """Runs leases with the worker's shared pool, S3 client and settings."""

    def __init__(self, *, pool: asyncpg.Pool, s3: Any, settings: Settings) -> None:
        self._pool = pool
        self._s3 = s3
        self._settings = settings

    async def run(self, claimed: ClaimedOperation) -> None:
        """Run ``claimed`` and record how it ended. Raises ``CancelledError`` on shutdown, and a database
        error only when even recording the outcome failed (the lease then expires and the janitor
        re-enqueues the operation).
        """
        with _attempt_context(claimed):
            async with self._heartbeating(claimed):
                await self._attempt(claimed)

    async def finish_cancellation(self, claimed: ClaimedOperation) -> None:
        """Finish the cancel of an operation nobody else holds, whose lease ``claim_cancellation`` took:
        remove every object, then CANCELED (README: States and failure model, Cancel). If S3 refuses, the
        lease is left to expire and the janitor finishes it on a later pass.
        """
        with _attempt_context(claimed):
            async with self._heartbeating(claimed):
                await self._finish_cancel(claimed, attempt_open=False)

    @contextlib.asynccontextmanager
    async def _heartbeating(self, claimed: ClaimedOperation) -> AsyncIterator[None]:
        """Extend ``claimed`` every ``heartbeat_seconds`` while the block runs."""
        heartbeat = asyncio.create_task(self._heartbeat(claimed), name=f"heartbeat-{claimed.operation_id}")
        try:
            yield
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat

    async def _attempt(self, claimed: ClaimedOperation) -> None:
        try:
            await ExportJob(pool=self._pool, s3=self._s3, settings=self._settings, claimed=claimed).run()
            metrics.ATTEMPTS_ENDED.labels(State.SUCCEEDED).inc()
        except LeaseLost as lost:
            await self._after_lease_lost(claimed, write=lost.write)
        except asyncio.CancelledError:
            await asyncio.shield(self._hand_back(claimed))
            raise
        except Exception as exc:
            if _being_cancelled():
                # A cancel can surface as the driver's own error (asyncpg interrupted mid-COPY raises
                # InternalClientError): a shutdown still hands the lease back rather than spending an attempt.
                await asyncio.shield(self._hand_back(claimed))
                raise asyncio.CancelledError from exc
            await self._end_failed_attempt(claimed, exc)

    async def refuse(self, claimed: ClaimedOperation) -> None:
        """End ``claimed`` FAILED with ``ACCESS_REVOKED`` before any work: the owner is no longer a member
        (README: States and failure model). Objects that earlier generations left are removed first; what S3
        refuses now, the janitor removes once the operation has ended.
        """
        with _attempt_context(claimed):
            await remove_artifacts(
                self._pool, self._s3, bucket=self._settings.s3_bucket, operation_id=claimed.operation_id
            )
            await self._end_failed_attempt(claimed, access_revoked())

    async def _heartbeat(self, claimed: ClaimedOperation) -> None:
        while True:
            await asyncio.sleep(self._settings.heartbeat_seconds)
            try:
                async with self._pool.acquire() as conn:
                    held = await operations.extend_lease(
                        conn,
                        operation_id=claimed.operation_id,
                        generation=claimed.generation,
                        lease_seconds=self._settings.lease_seconds,
                    )
                    now = None if held else await current_state(conn, operation_id=claimed.operation_id)
            except TRANSIENT_DATABASE_ERRORS:
                log.warning("heartbeat failed; will try again", extra=claimed.log_extra())
                continue
            if not held:
                # The job itself stops at its next fenced write; a cancel is finished there.
                if now is not None and now.generation > claimed.generation:
                    _report_rejection(claimed, write="heartbeat", now=now)
                return

    async def _after_lease_lost(self, claimed: ClaimedOperation, *, write: str) -> None:
        """A fenced ``write`` matched nothing: finish the cancel it was refused for, or count and log the
        rejection of a superseded generation's write (README: States and failure model).
        """
        async with self._pool.acquire() as conn:
            now = await current_state(conn, operation_id=claimed.operation_id)
        if now is not None and now.state == State.CANCEL_REQUESTED and now.generation == claimed.generation:
            await self._finish_cancel(claimed, attempt_open=True)
            return
        metrics.ATTEMPTS_ENDED.labels("LEASE_LOST").inc()
        _report_rejection(claimed, write=write, now=now)

    async def _finish_cancel(self, claimed: ClaimedOperation, *, attempt_open: bool) -> None:
        """CANCELED once every object of the operation is gone (README: States and failure model, Cancel);
        if S3 refuses, let the lease go (handed back when an export attempt holds it, else left to expire)
        so that the janitor finishes the cancellation on a later pass. ``attempt_open``: the lease is an
        export attempt's.
        """
        removed = await remove_artifacts(
            self._pool, self._s3, bucket=self._settings.s3_bucket, operation_id=claimed.operation_id
        )
        async with self._pool.acquire() as conn:
            if not removed:
                if attempt_open and await operations.hand_back(
                    conn, operation_id=claimed.operation_id, generation=claimed.generation
                ):
                    metrics.ATTEMPTS_ENDED.labels("HANDED_BACK").inc()
                log.warning("cancel left to the janitor: objects remain", extra=claimed.log_extra())
            elif await finish_cancel(
                conn, operation_id=claimed.operation_id, generation=claimed.generation, abandoned=False
            ):
                if attempt_open:
                    metrics.ATTEMPTS_ENDED.labels(State.CANCELED).inc()
                CANCELLATIONS_FINISHED.labels("worker").inc()
                log.info("export canceled by the worker", extra=claimed.log_extra())

    async def _end_failed_attempt(self, claimed: ClaimedOperation, exc: Exception) -> None:
        outcome = classify(exc, attempt=claimed.attempt, settings=self._settings)
        if outcome.code == "ACCESS_REVOKED":
            AUTHORIZATION_REFUSALS.labels("execute").inc()
        if is_missing_bucket(exc):
            # Recreated here, so that the retry can succeed once the file store is back.
            with contextlib.suppress(Exception):
                await ensure_bucket(self._s3, self._settings.s3_bucket)
        log.warning(
            "export attempt failed",
            extra=claimed.log_extra(error=error_name(exc), code=outcome.code, next_state=outcome.state),
        )
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                ended = await operations.end_attempt(
                    conn,
                    operation_id=claimed.operation_id,
                    generation=claimed.generation,
                    state=outcome.state,
                    error_code=outcome.code,
                    error_message=outcome.message,
                    retry_delay_seconds=outcome.retry_delay_seconds,
                )
                if ended and outcome.retry_delay_seconds is not None:
                    await enqueue_run(
                        conn, operation_id=claimed.operation_id, delay_seconds=outcome.retry_delay_seconds
                    )
        except TRANSIENT_DATABASE_ERRORS:
            # The lease expires and the janitor re-enqueues the operation: nothing is lost.
            log.warning("could not record the failed attempt", extra=claimed.log_extra())
            return
        if not ended:
            await self._after_lease_lost(claimed, write="state")
        else:
            metrics.ATTEMPTS_ENDED.labels(outcome.state).inc()

    async def _hand_back(self, claimed: ClaimedOperation) -> None:
        handed_back = False
        with contextlib.suppress(*TRANSIENT_DATABASE_ERRORS):
            async with self._pool.acquire() as conn, conn.transaction():
                handed_back = await operations.hand_back(
                    conn, operation_id=claimed.operation_id, generation=claimed.generation
                )
                if handed_back:
                    await enqueue_run(conn, operation_id=claimed.operation_id)
        if handed_back:  # counted once the hand-back has committed
            metrics.ATTEMPTS_ENDED.labels("HANDED_BACK").inc()
            log.info("lease handed back on shutdown", extra=claimed.log_extra())


@contextlib.contextmanager
def _attempt_context(claimed: ClaimedOperation) -> Iterator[None]:
    """While an attempt runs: counted in the running gauge, and every log line names its operation,
    generation and attempt (the job adds the phase as it goes).
    """
    with metrics.EXPORTS_RUNNING.track_inprogress(), log_fields(**claimed.log_extra(phase=Phase.STARTING)):
        yield


def _report_rejection(claimed: ClaimedOperation, *, write: str, now: CurrentState | None) -> None:
    """Log a fenced write that matched nothing; count it when a newer generation holds the operation."""
    superseded = now is not None and now.generation > claimed.generation
    if superseded:
        metrics.STALE_GENERATION_WRITES.labels(write=write).inc()
    log.warning(
        "fenced write rejected: a newer generation holds the operation" if superseded else "fenced write rejected",
        extra=claimed.log_extra(write=write, state_now=now and now.state, generation_now=now and now.generation),
    )


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
