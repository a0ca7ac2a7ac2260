"""One chunk of a chunked export (docs/chunks.md: Chunked exports): its wake-up on the chunk queue, the claim
of its lease, the writing of its seq range into an object of its own, and how its attempt ends.

A chunk's object is the rendering of its messages as the file holds them there: the format's header only in
the first chunk, its footer only in the last, rendered on from the file's message before the range when the
format carries state over (HTML's day sections), and every chunk its own gzip member when compressed, so
that the outputs in seq order are the file. A split result's chunk is instead one part of it, a complete file
that ends early, handing the rest of its range to a new chunk, where the part is full. Its writes
are fenced by the chunk's generation and by the operation being RUNNING (``shared.repository.chunks``): a
cancel or a newer generation stops it at its next write, and it removes what it uploaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import asyncpg
from aio_pika.abc import AbstractIncomingMessage

from services.worker import metrics
from services.worker.errors import PermanentError, classify, error_name, require_member
from services.worker.queue.consumer import NotClaimed, claim_or_requeue, decode_payload
from services.worker.writing.files import Destination, FileSet, PartFull
from services.worker.writing.ranges import RangeReader
from services.worker.writing.read_source import ReadSource
from shared import tracing
from shared.artifact_removal import remove_object
from shared.db import TRANSIENT_DATABASE_ERRORS
from shared.ids import is_operation_id
from shared.lease import LeaseLost, handed_back_on_stop, heartbeating
from shared.logs import log_fields
from shared.repository import chunks, export_reader
from shared.repository.chunks import ClaimedChunk
from shared.repository.export_reader import ExportRow
from shared.settings import WorkerPartSettings
from shared.states import ChunkState
from shared.storage import CHUNK_EXTENSION, chunk_key_stem

log = logging.getLogger(__name__)

# The least time between two progress writes of a chunk's holder (each also notices a cancel).
PROGRESS_INTERVAL_SECONDS = 1.0


class ChunkDeliveries:
    """The chunk queue's deliveries, ``{"operation_id": ..., "chunk": n}``: claim the chunk, settle the
    message, write the chunk.
    """

    what = "chunk"

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        s3: Any,
        settings: WorkerPartSettings,
        worker_id: str,
        reads: ReadSource | None = None,
    ) -> None:
        self._pool = pool
        self._s3 = s3
        self._settings = settings
        self._worker_id = worker_id
        self._reads = reads or ReadSource(primary=pool)

    def decode(self, body: bytes) -> tuple[str, int] | None:
        """(operation id, chunk number) of a chunk's wake-up, or None for anything else."""
        payload = decode_payload(body)
        if payload is None:
            return None
        operation_id, chunk_no = payload.get("operation_id"), payload.get("chunk")
        if not (isinstance(operation_id, str) and is_operation_id(operation_id)):
            return None
        return (operation_id, chunk_no) if type(chunk_no) is int and chunk_no >= 1 else None

    async def handle(self, message: AbstractIncomingMessage, key: tuple[str, int]) -> None:
        """Claim the chunk, settle ``message``, and write the chunk when the claim took it; in a span of the
        export's trace (its outbox row carried the operation's context).
        """
        operation_id, chunk_no = key
        with tracing.span(
            "export chunk", attributes={tracing.OPERATION_ID: operation_id, "chatexport.chunk": chunk_no}
        ):
            await self._handle(message, operation_id, chunk_no)

    async def _handle(self, message: AbstractIncomingMessage, operation_id: str, chunk_no: int) -> None:
        settings = self._settings

        async def claim() -> ClaimedChunk | None:
            async with self._pool.acquire() as conn:
                return await chunks.claim(
                    conn,
                    operation_id=operation_id,
                    chunk_no=chunk_no,
                    worker_id=self._worker_id,
                    lease_seconds=settings.lease_seconds,
                    key_stem=chunk_key_stem(settings, operation_id, chunk_no),
                    extension=CHUNK_EXTENSION,
                )

        def runner(claimed: ClaimedChunk) -> ChunkRunner:
            return ChunkRunner(pool=self._pool, s3=self._s3, settings=settings, claimed=claimed, reads=self._reads)

        async def hand_back(claimed: ClaimedChunk) -> None:
            await runner(claimed).hand_back()

        try:
            claimed = await claim_or_requeue(
                message, claim, hand_back=hand_back, log_extra={"operation_id": operation_id, "chunk": chunk_no}
            )
        except NotClaimed:
            return
        if claimed is None:
            return
        if claimed.took_over:
            metrics.CHUNK_TAKEOVERS.inc()
        with metrics.CHUNKS_RUNNING.track_inprogress(), log_fields(**claimed.log_extra()):
            await runner(claimed).run()


class ChunkRunner:
    """Runs one claimed chunk to its end: heartbeats while it is written, then DONE with its output, a retry
    after a backoff, FAILED once its budget is spent, or the lease handed back on shutdown.
    """

    def __init__(
        self, *, pool: asyncpg.Pool, s3: Any, settings: WorkerPartSettings, claimed: ClaimedChunk, reads: ReadSource
    ) -> None:
        self._pool = pool
        self._s3 = s3
        self._settings = settings
        self._claimed = claimed
        self._split = claimed.request.max_part_bytes is not None
        self._reader = RangeReader(
            # Standby reads only where the claim shows (docs/deploy.md: Export reads on a hot standby).
            source=reads.claimed(
                lambda conn: chunks.claim_visible(
                    conn, operation_id=claimed.operation_id, chunk_no=claimed.chunk_no, generation=claimed.generation
                )
            ),
            settings=settings,
            operation_id=claimed.operation_id,
            conversation_id=claimed.conversation_id,
            request=claimed.request,
            kind=claimed.request.file_kind,
            split=self._split,
        )
        self._files = FileSet(s3, settings, self._destination(previous=None))
        self._progress_written_at: float | None = None

    def _destination(self, *, previous: ExportRow | None) -> Destination:
        """The chunk's object: the header in the first chunk only, the footer in the last only, rendered on
        from ``previous``; a split result's part, whole, of at most ``max_part_bytes``.
        """
        claimed = self._claimed
        if self._split:
            return Destination(
                claimed.object_key,
                claimed.request.file_kind,
                claimed.conversation_id,
                max_part_bytes=claimed.request.max_part_bytes,
                one_file=True,
            )
        return Destination(
            claimed.object_key,
            claimed.request.file_kind,
            claimed.conversation_id,
            max_part_bytes=None,
            header=claimed.first_chunk,
            footer=claimed.last_chunk,
            previous=previous,
        )

    async def _previous_message(self) -> ExportRow | None:
        """The file's message before this chunk's range, when the format's rendering carries over from it
        (HTML's day sections) and the chunk is not a file of its own, else None without a query.
        """
        claimed = self._claimed
        if (
            claimed.first_chunk
            or self._split
            or not claimed.request.file_kind.renderer(claimed.conversation_id).carries_over
        ):
            return None
        async with self._pool.acquire() as conn:
            return await export_reader.last_export_row(
                conn,
                operation_id=claimed.operation_id,
                conversation_id=claimed.conversation_id,
                after_seq=claimed.request.after_seq,
                last_seq=claimed.range_after_seq,
                request=claimed.request,
            )

    async def run(self) -> None:
        """Write the chunk and record how the attempt ended. Raises ``CancelledError`` on shutdown (after
        handing the lease back); a database error while recording the end leaves the lease to expire, and
        the export's coordinator wakes the chunk again.
        """
        async with heartbeating(
            self._extend,
            every_seconds=self._settings.heartbeat_seconds,
            name=f"heartbeat-{self._claimed.operation_id}-{self._claimed.chunk_no}",
            log_extra=self._claimed.log_extra(),
        ):
            await self._run()

    async def _run(self) -> None:
        try:
            async with handed_back_on_stop(self.hand_back, log_extra=self._claimed.log_extra()):
                await self._write()
            metrics.CHUNKS_ENDED.labels("DONE").inc()
        except LeaseLost:
            metrics.CHUNKS_ENDED.labels("LEASE_LOST").inc()
            log.info("chunk lease lost: superseded or canceled", extra=self._claimed.log_extra())
            # Let go of a lease still ours (the export was canceled), so that the chunk shows nobody holds it.
            await asyncio.shield(self._end(retry_delay_seconds=None, counted=False))
        except Exception as exc:
            await self._fail(exc)

    async def hand_back(self) -> None:
        """End the lease now, on a stop: the chunk is PENDING again with no attempt spent, and its coordinator
        wakes it for another worker at once (``chunks.release``)."""
        await self._end(retry_delay_seconds=None)

    async def _write(self) -> None:
        claimed = self._claimed
        if claimed.previous_key is not None and claimed.previous_key != claimed.object_key:
            # An earlier generation's output, whole or partial: never to be assembled now.
            with contextlib.suppress(Exception):
                await remove_object(self._s3, bucket=self._settings.s3_bucket, key=claimed.previous_key)
        previous = await self._previous_message()
        if previous is not None:
            self._files = FileSet(self._s3, self._settings, self._destination(previous=previous))
        full = False
        try:
            await self._reader.write(
                self._files,
                after=claimed.range_after_seq,
                last=claimed.range_last_seq,
                after_each=self._record_progress,
            )
        except PartFull:
            full = True
        (stored,) = await self._files.finish()
        seqs = None if stored.first_seq is None or stored.last_seq is None else (stored.first_seq, stored.last_seq)
        async with self._pool.acquire() as conn, conn.transaction():
            # Membership is checked again as each chunk finishes (docs/chunks.md: Chunked exports).
            await require_member(conn, conversation_id=claimed.conversation_id, user_id=claimed.owner_id)
            if not await chunks.finish(
                conn,
                operation_id=claimed.operation_id,
                chunk_no=claimed.chunk_no,
                generation=claimed.generation,
                size_bytes=stored.size_bytes,
                sha256=stored.sha256,
                message_count=stored.message_count,
                message_seqs=seqs,
                ended_at_seq=stored.last_seq if full else None,
            ):
                raise LeaseLost("chunk")
        log.info("chunk done", extra=claimed.log_extra(size_bytes=stored.size_bytes, messages=stored.message_count))

    async def _record_progress(self) -> None:
        now = time.monotonic()
        if self._progress_written_at is not None and now - self._progress_written_at < PROGRESS_INTERVAL_SECONDS:
            return
        self._progress_written_at = now
        if not await self._extend():
            raise LeaseLost("progress")

    async def _extend(self) -> bool:
        claimed = self._claimed
        messages, stored_bytes = self._files.progress()
        async with self._pool.acquire() as conn:
            return await chunks.extend(
                conn,
                operation_id=claimed.operation_id,
                chunk_no=claimed.chunk_no,
                generation=claimed.generation,
                lease_seconds=self._settings.lease_seconds,
                messages_written=messages,
                bytes_written=stored_bytes,
            )

    async def _fail(self, exc: Exception) -> None:
        """End a failed attempt: FAILED at once when the owner lost access (the coordinator then fails the
        export), else a retry after the backoff of its attempt number, FAILED once the budget is spent.
        """
        revoked = isinstance(exc, PermanentError)
        verdict = classify(exc, attempt=self._claimed.attempts + 1, settings=self._settings)
        log.warning("chunk attempt failed", extra=self._claimed.log_extra(error=error_name(exc), code=verdict.code))
        await asyncio.shield(self._discard())
        delay = 0.0 if revoked else (verdict.retry_delay_seconds or 0.0)
        await self._end(
            retry_delay_seconds=delay,
            error_code=verdict.code,
            error_message=verdict.message,
            max_attempts=1 if revoked else self._settings.max_attempts,
        )

    async def _end(self, *, retry_delay_seconds: float | None, counted: bool = True, **failure: Any) -> None:
        """``chunks.release`` of this lease, counted by its outcome when ``counted``; a lost database leaves the
        lease to expire.
        """
        claimed = self._claimed
        if retry_delay_seconds is None:
            await self._abandon()
        try:
            async with self._pool.acquire() as conn:
                state = await chunks.release(
                    conn,
                    operation_id=claimed.operation_id,
                    chunk_no=claimed.chunk_no,
                    generation=claimed.generation,
                    retry_delay_seconds=retry_delay_seconds,
                    **failure,
                )
        except TRANSIENT_DATABASE_ERRORS:
            log.warning("could not record the chunk's end; its lease expires", extra=claimed.log_extra())
            return
        # Only a lease this call let go of leaves an object nobody needs: a stop that lands just after the
        # chunk's DONE committed finds nothing RUNNING to release, and the DONE chunk's object must stay for
        # the assembly. Another generation's key is never this one's (docs/chunks.md: Chunked exports).
        if retry_delay_seconds is None and state is not None:
            await self._remove_object()
        if not counted:
            return
        if state is None:
            metrics.CHUNKS_ENDED.labels("LEASE_LOST").inc()
        elif retry_delay_seconds is None:
            metrics.CHUNKS_ENDED.labels("HANDED_BACK").inc()
        else:
            metrics.CHUNKS_ENDED.labels("FAILED" if state == ChunkState.FAILED else "RETRY").inc()

    async def _discard(self) -> None:
        """Stop the upload in flight and remove this generation's object."""
        await self._abandon()
        await self._remove_object()

    async def _abandon(self) -> None:
        """Stop the upload in flight (nothing to stop once the chunk's file is finished)."""
        for writer in self._files.writers():
            await writer.abandon()

    async def _remove_object(self) -> None:
        """Remove this generation's object; what S3 refuses now, the janitor removes once nothing names it."""
        try:
            await remove_object(self._s3, bucket=self._settings.s3_bucket, key=self._claimed.object_key)
        except Exception:
            log.warning("could not remove the chunk's object; left to the janitor", extra=self._claimed.log_extra())
