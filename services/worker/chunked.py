"""The coordinator of a chunked export (docs/chunks.md: Chunked exports): the operation's lease holder plans
the chunks at the first claim that finds the export big enough, wakes them through the outbox as the
per-export cap frees a place, folds their progress into the operation, and assembles the file once every
chunk is DONE.

The plan is kept by every later generation (the same snapshot, the same ranges), and a DONE chunk is never
redone: a coordinator that takes over waits only for the chunks not yet DONE. A split result's chunks are
its parts: each is copied, whole, to the part's key (docs/chunks.md: Split results).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from services.worker.assembly import Assembly
from services.worker.errors import LeaseLost, NeedsRepair, access_revoked
from services.worker.files import Destination
from services.worker.read_source import ReadSource
from shared.export.phases import Phase
from shared.repository import chunks, export_reader, outbox
from shared.repository.artifacts import ArtifactFiles, StoredPart
from shared.repository.chunks import Chunk, PlannedRange
from shared.repository.leases import ClaimedOperation
from shared.settings import MAX_CHUNKS, Settings
from shared.states import ChunkState

# How often the coordinator looks at its chunks (the database is the only channel between the workers).
POLL_SECONDS = 0.2
# A split result's chunks are planned at this share of max_part_bytes: the plan estimates JSONL lines, and
# a chunk whose rendering outgrows the part ends early, leaving the rest of its range to a new chunk.
SPLIT_CHUNK_SHARE = 0.75
_REVOKED = access_revoked().code

Progress = Callable[[Phase, tuple[int, int]], Awaitable[None]]
OnUpload = Callable[[str], Awaitable[None]]


class ChunkedExport:
    """The chunked path of one attempt for ``claimed``, whose file is ``key`` of ``content_type``.

    ``progress(phase, (messages, bytes))`` is the attempt's fenced progress write (it raises ``LeaseLost``
    on a cancel or a takeover); ``on_upload(upload_id)`` records the assembly's upload; the plan weighs the
    messages through ``reads`` (the standby or the primary, ``services.worker.read_source``).
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
        reads: ReadSource,
    ) -> None:
        self._pool = pool
        self._reads = reads
        self._s3 = s3
        self._settings = settings
        self._claimed = claimed
        self._last_seq = last_seq
        self._progress = progress

    def applies(self) -> bool:
        """Whether this export may be chunked at all: chunking is on, and it is not a split result with a
        filter (the plan weighs every message, so such a result's parts would each hold a filter's share of
        a part: many small ones where one stream writes few).
        """
        request = self._claimed.request
        return self._settings.chunk_threshold_bytes > 0 and not (
            request.max_part_bytes is not None and request.selects_messages
        )

    async def plan(self) -> list[Chunk]:
        """The export's chunks: those an earlier generation planned (FAILED ones made PENDING again: this is
        a new attempt), or a new plan when the messages are estimated above ``chunk_threshold_bytes``;
        empty when the export is written in one stream. Raises ``LeaseLost`` when the plan's fence fails.
        """
        claimed = self._claimed
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
        # Weighing reads every message of the export: not on the primary when a standby can serve it.
        ranges = await (await self._reads.begin()).run(self._weigh)
        if len(ranges) < 2:
            return []
        async with self._pool.acquire() as conn:
            if not await chunks.plan(
                conn, operation_id=claimed.operation_id, generation=claimed.generation, ranges=ranges
            ):
                raise LeaseLost("plan")
            return await chunks.chunks_of(conn, operation_id=claimed.operation_id)

    async def _weigh(self, conn: asyncpg.Connection) -> list[PlannedRange]:
        """The ranges of the chunks the export's messages would make; none when they are estimated at or
        below ``chunk_threshold_bytes``.
        """
        conversation_id, after = self._claimed.conversation_id, self._claimed.request.after_seq
        total = await export_reader.range_bytes(
            conn, conversation_id=conversation_id, after_seq=after, last_seq=self._last_seq, recalled=False
        )
        if total <= self._settings.chunk_threshold_bytes:
            return []
        return await export_reader.plan_ranges(
            conn,
            conversation_id=conversation_id,
            after_seq=after,
            last_seq=self._last_seq,
            target_bytes=self._target_bytes(total),
        )

    def _target_bytes(self, total: int) -> int:
        """The estimated bytes of each chunk of ``total``: ``chunk_target_bytes``, more when the chunks of one
        upload would be too many, less for a split result's parts.
        """
        max_part_bytes = self._claimed.request.max_part_bytes
        target = self._settings.chunk_target_bytes
        if max_part_bytes is not None:
            target = min(target, int(max_part_bytes * SPLIT_CHUNK_SHARE))
        return max(target, math.ceil(total / MAX_CHUNKS))

    def _may_exceed_threshold(self, seqs: int) -> bool:
        """False when ``seqs`` messages cannot reach the threshold even at the largest body a message may
        have: a small export then costs no estimate at all.
        """
        settings = self._settings
        largest = (
            max(settings.message_body_max_bytes, settings.import_body_max_bytes) + export_reader.LINE_OVERHEAD_BYTES
        )
        return seqs * largest > settings.chunk_threshold_bytes

    async def write(self, destination: Destination, *, on_upload: OnUpload) -> ArtifactFiles:
        """Wake the chunks and assemble the files of ``destination`` from them, each chunk as soon as it and
        every one before it are DONE, while the later ones are written; ``on_upload(upload_id)`` records each
        upload before its first part. Raises ``LeaseLost`` (a cancel, a takeover), ``PermanentError`` (a chunk
        found the owner no longer a member), ``NeedsRepair`` (a chunk spent its budget), ``StoredBytesDiffer``
        and S3's errors.
        """
        totals = (0, 0)

        async def after_part() -> None:
            await self._progress(Phase.WRITING, totals)

        def assembly(key: str) -> Assembly:
            content_type = destination.kind.content_type
            return Assembly(
                self._s3, self._settings, key=key, content_type=content_type, on_upload=on_upload, after_part=after_part
            )

        done: asyncio.Queue[Chunk | None] = asyncio.Queue()
        assemble = _assemble_parts if destination.max_part_bytes is not None else _assemble_file
        assembling = asyncio.create_task(assemble(destination, assembly, done))
        try:
            added = 0
            while True:
                now = await self._look()
                totals = _totals(now)
                await self._progress(Phase.WRITING, totals)
                # A chunk that ends early adds the rest of its range after itself, so ``added`` stays valid.
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


async def _assemble_file(
    destination: Destination, assembly: Callable[[str], Assembly], done: asyncio.Queue[Chunk | None]
) -> ArtifactFiles:
    """One file: add each chunk ``done`` yields, in order, until None, to one upload; then finish it."""
    file = assembly(destination.key)
    await file.start()
    while (chunk := await done.get()) is not None:
        await file.add(chunk)
    return await file.finish()


async def _assemble_parts(
    destination: Destination, assembly: Callable[[str], Assembly], done: asyncio.Queue[Chunk | None]
) -> ArtifactFiles:
    """A split result: each chunk ``done`` yields that holds a message becomes the next part, whole (a chunk
    a filter left empty adds nothing, unless no chunk holds a message: an empty export has one part).
    """
    parts: list[StoredPart] = []
    empty: Chunk | None = None
    while (chunk := await done.get()) is not None:
        if chunk.message_count:
            parts.append(await _part(destination, assembly, chunk, number=len(parts) + 1))
        elif empty is None:
            empty = chunk
    if not parts and empty is not None:
        parts.append(await _part(destination, assembly, empty, number=1))
    return ArtifactFiles(destination.key, tuple(parts), split=True)


async def _part(
    destination: Destination, assembly: Callable[[str], Assembly], chunk: Chunk, *, number: int
) -> StoredPart:
    """Part ``number`` of a split result: ``chunk``'s object copied to the part's key."""
    key = destination.file_key(number)
    part = assembly(key)
    await part.start()
    await part.add(chunk)
    (stored,) = (await part.finish()).parts
    return StoredPart(
        number,
        key,
        stored.size_bytes,
        stored.sha256,
        stored.message_count,
        chunk.first_message_seq,
        chunk.last_message_seq,
    )


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
