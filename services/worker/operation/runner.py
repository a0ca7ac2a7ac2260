"""Running one claimed lease to its end: heartbeats while the job works, then the record of how the attempt
ended, every end written here: SUCCEEDED with what the job returns (``services.worker.operation.job``), or FAILED,
RETRY_AT, FAILED_REPAIR, CANCELED, or the lease handed back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import asyncpg

from services.worker import metrics
from services.worker.errors import (
    ArtifactGone,
    PermanentError,
    access_revoked,
    classify,
    error_name,
    is_missing_bucket,
)
from services.worker.operation.job import ExportJob, Written
from services.worker.writing.read_source import ReadSource
from shared import tracing
from shared.artifact_removal import remove_artifacts, remove_chunk_objects
from shared.db import TRANSIENT_DATABASE_ERRORS
from shared.export.phases import Phase
from shared.lease import LeaseLost, handed_back_on_stop, heartbeating
from shared.logs import log_fields
from shared.metrics import AUTHORIZATION_REFUSALS, CANCELLATIONS_FINISHED
from shared.repository import leases
from shared.repository.leases import ClaimedOperation, CurrentState, SucceedOutcome, current_state, finish_cancel
from shared.repository.outbox import enqueue_run
from shared.settings import WorkerPartSettings
from shared.states import State
from shared.storage import ensure_bucket

log = logging.getLogger(__name__)


class LeaseRunner:
    """Runs leases with the worker's shared pool, S3 client and settings; the exports' messages are read
    through ``reads`` (default: the pool).
    """

    def __init__(
        self, *, pool: asyncpg.Pool, s3: Any, settings: WorkerPartSettings, reads: ReadSource | None = None
    ) -> None:
        self._pool = pool
        self._s3 = s3
        self._settings = settings
        self._reads = reads or ReadSource(primary=pool)

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
        remove every object, then CANCELED (docs/states.md: States and failure model, Cancel). If S3 refuses, the
        lease is left to expire and the janitor finishes it on a later pass.
        """
        with _attempt_context(claimed):
            async with self._heartbeating(claimed):
                await self._finish_cancel(claimed, attempt_open=False)

    def _heartbeating(self, claimed: ClaimedOperation) -> contextlib.AbstractAsyncContextManager[None]:
        """Extend ``claimed`` every ``heartbeat_seconds`` while the block runs (``shared.lease``)."""
        return heartbeating(
            lambda: self._extend(claimed),
            every_seconds=self._settings.heartbeat_seconds,
            name=f"heartbeat-{claimed.operation_id}",
            log_extra=claimed.log_extra(),
        )

    async def _attempt(self, claimed: ClaimedOperation) -> None:
        try:
            async with handed_back_on_stop(lambda: self.hand_back(claimed), log_extra=claimed.log_extra()):
                await self._export(claimed)
            metrics.ATTEMPTS_ENDED.labels(State.SUCCEEDED).inc()
        except LeaseLost as lost:
            await self._after_lease_lost(claimed, write=lost.write)
        except Exception as exc:
            await self._end_failed_attempt(claimed, exc)

    async def _export(self, claimed: ClaimedOperation) -> None:
        """Have the job write (or find) the files, then commit SUCCEEDED with them. When the object of an
        earlier generation the job would adopt is removed before the commit takes it, a new job looks again
        (docs/states.md: States and failure model, Unknown outcomes): each look removes that object for good.
        """
        while True:
            job = ExportJob(pool=self._pool, s3=self._s3, settings=self._settings, claimed=claimed, reads=self._reads)
            written = await job.write()
            if await self._succeed(claimed, job, written):
                if job.chunked or written.adopted:
                    # The chunks are in the published file now (docs/chunks.md: Chunked exports).
                    await remove_chunk_objects(
                        self._pool, self._s3, bucket=self._settings.s3_bucket, operation_id=claimed.operation_id
                    )
                return

    async def _succeed(self, claimed: ClaimedOperation, job: ExportJob, written: Written) -> bool:
        """Commit SUCCEEDED with ``written`` after the membership re-check, in one transaction (docs/states.md: States
        and failure model); False, with nothing committed, when ``written`` was adopted and its object removed
        meanwhile. Raises ``PermanentError`` (access revoked), ``LeaseLost`` or a transient error; the object of
        ``written`` is removed first (``_must_discard``).
        """
        commit_sent = False
        try:
            with tracing.span("publish result", attributes=claimed.span_attributes()):
                async with self._pool.acquire() as conn:
                    # One statement: once it is sent, its outcome may be unknown (a lost connection), so the
                    # object must not be removed here; the janitor removes it if it was not published.
                    commit_sent = True
                    await self._publish(conn, claimed, written)
        except BaseException as exc:
            if isinstance(exc, ArtifactGone) and written.adopted:
                return False
            if _must_discard(exc, written, commit_sent=commit_sent):
                await asyncio.shield(job.discard(written.generation))
            raise
        _report_success(claimed, written)
        return True

    async def _publish(self, conn: asyncpg.Connection, claimed: ClaimedOperation, written: Written) -> None:
        """The SUCCEEDED commit on ``conn`` (``leases.succeed_export``); raises ``PermanentError`` (access
        revoked), ``LeaseLost``, or ``ArtifactGone`` when the object of ``written`` was removed meanwhile.
        """
        outcome = await leases.succeed_export(
            conn,
            claimed=claimed,
            files=written.files,
            artifact_generation=written.generation,
            result_ttl_seconds=self._settings.result_ttl_seconds,
        )
        if outcome is SucceedOutcome.NOT_MEMBER:
            raise access_revoked()
        if outcome is SucceedOutcome.LEASE_LOST:
            raise LeaseLost("result")
        if outcome is SucceedOutcome.ARTIFACT_GONE:
            raise ArtifactGone(written.files.key)

    async def refuse(self, claimed: ClaimedOperation) -> None:
        """End ``claimed`` FAILED with ``ACCESS_REVOKED`` before any work: the owner is no longer a member
        (docs/states.md: States and failure model). Objects that earlier generations left are removed first; what S3
        refuses now, the janitor removes once the operation has ended.
        """
        with _attempt_context(claimed):
            # A stop before the refusal is recorded spends no attempt: the next claim refuses it.
            async with handed_back_on_stop(lambda: self.hand_back(claimed), log_extra=claimed.log_extra()):
                await remove_artifacts(
                    self._pool, self._s3, bucket=self._settings.s3_bucket, operation_id=claimed.operation_id
                )
            await self._end_failed_attempt(claimed, access_revoked())

    async def _extend(self, claimed: ClaimedOperation) -> bool:
        """One heartbeat: extend the lease; when it is lost to a later generation, count and log that."""
        async with self._pool.acquire() as conn:
            held = await leases.extend_lease(
                conn,
                operation_id=claimed.operation_id,
                generation=claimed.generation,
                lease_seconds=self._settings.lease_seconds,
            )
            now = None if held else await current_state(conn, operation_id=claimed.operation_id)
        # Not held: the job itself stops at its next fenced write; a cancel is finished there.
        if not held and now is not None and now.generation > claimed.generation:
            _report_rejection(claimed, write="heartbeat", now=now)
        return held

    async def _after_lease_lost(self, claimed: ClaimedOperation, *, write: str) -> None:
        """A fenced ``write`` matched nothing: finish the cancel it was refused for, or count and log the
        rejection of a superseded generation's write (docs/states.md: States and failure model).
        """
        async with self._pool.acquire() as conn:
            now = await current_state(conn, operation_id=claimed.operation_id)
        if now is not None and now.state == State.CANCEL_REQUESTED and now.generation == claimed.generation:
            await self._finish_cancel(claimed, attempt_open=True)
            return
        metrics.ATTEMPTS_ENDED.labels("LEASE_LOST").inc()
        _report_rejection(claimed, write=write, now=now)

    async def _finish_cancel(self, claimed: ClaimedOperation, *, attempt_open: bool) -> None:
        """CANCELED once every object of the operation is gone (docs/states.md: States and failure model, Cancel);
        if S3 refuses, let the lease go (handed back when an export attempt holds it, else left to expire)
        so that the janitor finishes the cancellation on a later pass. ``attempt_open``: the lease is an
        export attempt's.
        """
        removed = await remove_artifacts(
            self._pool, self._s3, bucket=self._settings.s3_bucket, operation_id=claimed.operation_id
        )
        async with self._pool.acquire() as conn:
            if not removed:
                if attempt_open and await leases.hand_back(
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
        verdict = classify(exc, attempt=claimed.attempt, settings=self._settings)
        if verdict.code == "ACCESS_REVOKED":
            AUTHORIZATION_REFUSALS.labels("execute").inc()
        if is_missing_bucket(exc):
            # Recreated here, so that the retry can succeed once the file store is back.
            with contextlib.suppress(Exception):
                await ensure_bucket(self._s3, self._settings.s3_bucket)
        log.warning(
            "export attempt failed",
            extra=claimed.log_extra(error=error_name(exc), code=verdict.code, next_state=verdict.state),
        )
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                ended = await leases.end_attempt(
                    conn,
                    operation_id=claimed.operation_id,
                    generation=claimed.generation,
                    state=verdict.state,
                    error_code=verdict.code,
                    error_message=verdict.message,
                    retry_delay_seconds=verdict.retry_delay_seconds,
                )
                if ended and verdict.retry_delay_seconds is not None:
                    await enqueue_run(
                        conn, operation_id=claimed.operation_id, delay_seconds=verdict.retry_delay_seconds
                    )
        except TRANSIENT_DATABASE_ERRORS:
            # The lease expires and the janitor re-enqueues the operation: nothing is lost.
            log.warning("could not record the failed attempt", extra=claimed.log_extra())
            return
        if not ended:
            await self._after_lease_lost(claimed, write="state")
        else:
            metrics.ATTEMPTS_ENDED.labels(verdict.state).inc()

    async def hand_back(self, claimed: ClaimedOperation) -> None:
        """End the lease of ``claimed`` now, on a stop, with its attempt unspent, and wake the operation
        again so another worker takes it at once (``leases.hand_back``); a lost database leaves the lease to
        expire.
        """
        handed_back = False
        with contextlib.suppress(*TRANSIENT_DATABASE_ERRORS):
            async with self._pool.acquire() as conn, conn.transaction():
                handed_back = await leases.hand_back(
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


def _report_success(claimed: ClaimedOperation, written: Written) -> None:
    """Log the committed SUCCEEDED with its figures (DEBUG: the attempts-ended counter counts them, docs/operations.md:
    Logs); count and log an adoption.
    """
    files = written.files
    log.debug(
        "export succeeded",
        extra=claimed.log_extra(
            size_bytes=files.size_bytes,
            messages=files.message_count,
            parts=len(files.parts),
            key_generation=written.generation,
        ),
    )
    if written.adopted:
        metrics.ARTIFACTS_ADOPTED.inc()
        log.info("earlier generation's artifact adopted", extra=claimed.log_extra(adopted=written.generation))


def _must_discard(exc: BaseException, written: Written, *, commit_sent: bool) -> bool:
    """Whether ``written`` must be removed after its SUCCEEDED transaction raised ``exc``: always when canceled,
    superseded or refused (it must not outlive the attempt that wrote or found it; a published object is never
    removed), else only an object of this attempt's own whose commit was not sent.
    """
    if isinstance(exc, LeaseLost | PermanentError):
        return True
    return not (commit_sent or written.adopted)
