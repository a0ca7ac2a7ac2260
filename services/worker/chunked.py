"""The coordinator of a chunked export (docs/chunks.md: Chunked exports): the operation's lease holder plans
the chunks at the first claim that finds the export big enough, wakes them through the outbox as the
per-export cap frees a place, folds their progress into the operation, and assembles the file once every
chunk is DONE.

The plan is kept by every later generation (the same snapshot, the same ranges), and a DONE chunk is never
redone: a coordinator that takes over waits only for the chunks not yet DONE.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from services.worker.assembly import Assembly
from services.worker.errors import LeaseLost, NeedsRepair, access_revoked
from shared.phases import Phase
from shared.repository import chunks, export_reader, outbox
from shared.repository.artifacts import ArtifactFiles
from shared.repository.chunks import Chunk
from shared.repository.leases import ClaimedOperation
from shared.settings import Settings
from shared.states import ChunkState

# The most chunks of one plan: each chunk becomes at most two parts of the assembled upload, which S3
# allows 10,000 of.
MAX_CHUNKS = 5000
# How often the coordinator looks at its chunks (the database is the only channel between the workers).
POLL_SECONDS = 0.2
_REVOKED = access_revoked().code

Progress = Callable[[Phase, tuple[int, int]], Awaitable[None]]


class ChunkedExport:
    """The chunked path of one attempt for ``claimed``, whose file is ``key`` of ``content_type``.

    ``progress(phase, (messages, bytes))`` is the attempt's fenced progress write (it raises ``LeaseLost``
    on a cancel or a takeover); ``on_upload(upload_id)`` records the assembly's upload.
    """

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        s3: Any,
        settings: Settings,
        claimed: ClaimedOperation,
        last_seq: int,
        progress: Progress,
    ) -> None:
        self._pool = pool
        self._s3 = s3
        self._settings = settings
        self._claimed = claimed
        self._last_seq = last_seq
        self._progress = progress

    def applies(self) -> bool:
        """Whether this export may be chunked at all: chunking on, and not split into parts."""
        return self._settings.chunk_threshold_bytes > 0 and self._claimed.request.max_part_bytes is None

    async def plan(self) -> list[Chunk]:
        """The export's chunks: those an earlier generation planned (FAILED ones made PENDING again: this is
        a new attempt), or a new plan when the messages are estimated above ``chunk_threshold_bytes``;
        empty when the export is written in one stream. Raises ``LeaseLost`` when the plan's fence fails.
        """
        claimed, settings = self._claimed, self._settings
        after = claimed.request.after_seq
        # A small export costs no query: the same snapshot and settings never planned it either.
        if not self.applies() or not self._may_exceed_threshold(self._last_seq - after):
            return []
        async with self._pool.acquire() as conn:
            existing = await chunks.chunks_of(conn, operation_id=claimed.operation_id)
            if existing:
                if any(chunk.state == ChunkState.FAILED for chunk in existing):
                    await chunks.retry_failed(conn, operation_id=claimed.operation_id)
                return await chunks.chunks_of(conn, operation_id=claimed.operation_id)
            total = await export_reader.range_bytes(
                conn, conversation_id=claimed.conversation_id, after_seq=after, last_seq=self._last_seq
            )
            if total <= settings.chunk_threshold_bytes:
                return []
            ranges = await export_reader.plan_ranges(
                conn,
                conversation_id=claimed.conversation_id,
                after_seq=after,
                last_seq=self._last_seq,
                target_bytes=max(settings.chunk_target_bytes, math.ceil(total / MAX_CHUNKS)),
            )
            if len(ranges) < 2:
                return []
            if not await chunks.plan(
                conn, operation_id=claimed.operation_id, generation=claimed.generation, ranges=ranges
            ):
                raise LeaseLost("plan")
            return await chunks.chunks_of(conn, operation_id=claimed.operation_id)

    def _may_exceed_threshold(self, seqs: int) -> bool:
        """False when ``seqs`` messages cannot reach the threshold even at the largest body a message may
        have: a small export then costs no estimate at all.
        """
        settings = self._settings
        largest = (
            max(settings.message_body_max_bytes, settings.import_body_max_bytes) + export_reader.LINE_OVERHEAD_BYTES
        )
        return seqs * largest > settings.chunk_threshold_bytes

    async def write(self, key: str, *, content_type: str, on_upload: Callable[[str], Awaitable[None]]) -> ArtifactFiles:
        """Wake the chunks and assemble ``key`` from them, each chunk as soon as it and every one before it
        are DONE, while the later ones are written. Raises ``LeaseLost`` (a cancel, a takeover),
        ``PermanentError`` (a chunk found the owner no longer a member), ``NeedsRepair`` (a chunk spent its
        budget), ``StoredBytesDiffer`` and S3's errors.
        """
        totals = (0, 0)

        async def after_part() -> None:
            await self._progress(Phase.WRITING, totals)

        assembly = Assembly(
            self._s3, self._settings, key=key, content_type=content_type, on_upload=on_upload, after_part=after_part
        )
        await assembly.start()
        done: asyncio.Queue[Chunk | None] = asyncio.Queue()
        assembling = asyncio.create_task(_assemble(assembly, done))
        try:
            added = 0
            while True:
                now = await self._look()
                totals = _totals(now)
                await self._progress(Phase.WRITING, totals)
                while added < len(now) and now[added].state == ChunkState.DONE:
                    done.put_nowait(now[added])
                    added += 1
                if added == len(now):
                    done.put_nowait(None)
                    break
                await asyncio.wait({assembling}, timeout=POLL_SECONDS)  # the chunks' rows tell how far they are
                if assembling.done():
                    break
            if not assembling.done():
                await self._progress(Phase.UPLOADING, totals)  # every chunk is written: the last parts remain
            return await assembling
        finally:
            assembling.cancel()
            await asyncio.gather(assembling, return_exceptions=True)

    async def _look(self) -> list[Chunk]:
        """Wake what the cap allows and return every chunk as it is now; raises for a FAILED chunk."""
        operation_id = self._claimed.operation_id
        async with self._pool.acquire() as conn, conn.transaction():
            woken = await chunks.wake(
                conn,
                operation_id=operation_id,
                running_at_most=self._settings.chunks_per_export,
                requeue_after_seconds=self._settings.janitor_requeue_after_seconds,
            )
            for chunk_no in woken:
                await outbox.enqueue_chunk(conn, operation_id=operation_id, chunk_no=chunk_no)
            now = await chunks.chunks_of(conn, operation_id=operation_id)
        _raise_for_failed(now)
        return now


async def _assemble(assembly: Assembly, done: asyncio.Queue[Chunk | None]) -> ArtifactFiles:
    """Add each chunk ``done`` yields, in order, until None; then finish the assembly."""
    while (chunk := await done.get()) is not None:
        await assembly.add(chunk)
    return await assembly.finish()


def _totals(now: list[Chunk]) -> tuple[int, int]:
    """(messages, bytes) written so far: the finished chunks' counts and the running ones' current counts."""
    return sum(chunk.messages_written for chunk in now), sum(chunk.bytes_written for chunk in now)


def _raise_for_failed(now: list[Chunk]) -> None:
    for chunk in now:
        if chunk.state != ChunkState.FAILED:
            continue
        if chunk.error_code == _REVOKED:
            raise access_revoked()
        raise NeedsRepair(chunk.error_code or "INTERNAL_ERROR", f"Chunk {chunk.chunk_no}: {chunk.error_message}")
