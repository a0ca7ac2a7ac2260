"""The coordinator of a chunked export (docs/chunks.md: Chunked exports): once the operation's lease holder
has planned the chunks (``services.worker.chunked.plan``), it wakes them through the outbox as the
per-export cap frees a place, folds their progress into the operation, and assembles the file once every
chunk is DONE.

The plan is kept by every later generation (the same snapshot, the same ranges), and a DONE chunk is never
redone: a coordinator that takes over waits only for the chunks not yet DONE, and resumes the file's assembly
from its last checkpoint (docs/chunks.md: Chunked exports, A coordinator's takeover). A split result's chunks
are its parts: each is copied, whole, to the part's key (docs/chunks.md: Split results).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from services.worker.chunked.assembly import Assembly, Checkpoint
from services.worker.errors import NeedsRepair, access_revoked
from services.worker.writing.files import Destination
from shared.export.phases import Phase
from shared.repository import chunks, outbox
from shared.repository.artifacts import ArtifactFiles, StoredPart
from shared.repository.chunks import Chunk
from shared.repository.leases import ClaimedOperation
from shared.settings import WorkerPartSettings
from shared.states import ChunkState

# How often the coordinator looks at its chunks (the database is the only channel between the workers).
POLL_SECONDS = 0.2
_REVOKED = access_revoked().code

Progress = Callable[[Phase, tuple[int, int]], Awaitable[None]]
OnUpload = Callable[[str], Awaitable[None]]
OnCheckpoint = Callable[[Checkpoint], Awaitable[None]]


@dataclass(kw_only=True)
class ChunkedExport:
    """The chunked path of one attempt for ``claimed``, once its ``ChunkPlanner`` has planned the chunks.

    ``progress(phase, (messages, bytes))`` is the attempt's fenced progress write (it raises ``LeaseLost``
    on a cancel or a takeover); ``on_upload(upload_id)`` records the assembly's upload, and
    ``on_checkpoint(checkpoint)`` each checkpoint of a file's assembly (also fenced).
    """

    pool: asyncpg.Pool
    s3: Any
    settings: WorkerPartSettings
    claimed: ClaimedOperation
    progress: Progress

    async def write(
        self,
        destination: Destination,
        *,
        on_upload: OnUpload,
        on_checkpoint: OnCheckpoint,
        resume: Checkpoint | None = None,
    ) -> ArtifactFiles:
        """Wake the chunks and assemble the files of ``destination`` from them, each chunk as soon as it and
        every one before it are DONE, while the later ones are written; ``on_upload(upload_id)`` records each
        upload before its first part, and a file's assembly starts from ``resume`` when given. Raises
        ``LeaseLost`` (a cancel, a takeover), ``PermanentError`` (a chunk found the owner no longer a member),
        ``NeedsRepair`` (a chunk spent its budget), ``StoredBytesDiffer`` and S3's errors.
        """
        totals = (0, 0)

        async def after_part() -> None:
            await self.progress(Phase.WRITING, totals)

        def assembly(key: str, checkpoints: OnCheckpoint | None = None) -> Assembly:
            return Assembly(
                self.s3,
                self.settings,
                key=key,
                content_type=destination.kind.content_type,
                on_upload=on_upload,
                after_part=after_part,
                on_checkpoint=checkpoints,
            )

        done: asyncio.Queue[Chunk | None] = asyncio.Queue()
        if destination.max_part_bytes is not None:
            assembling = asyncio.create_task(_assemble_parts(destination, assembly, done))
        else:
            file = assembly(destination.key, on_checkpoint)
            assembling = asyncio.create_task(_assemble_file(file, done, resume))
        try:
            added = 0
            while True:
                now = await self._look()
                totals = _totals(now)
                await self.progress(Phase.WRITING, totals)
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
                await self.progress(Phase.UPLOADING, totals)  # every chunk is written: the last parts remain
            return await assembling
        finally:
            assembling.cancel()
            await asyncio.gather(assembling, return_exceptions=True)

    async def _look(self) -> list[Chunk]:
        """Wake what the cap allows and return every chunk as it is now; raises for a FAILED chunk."""
        operation_id = self.claimed.operation_id
        async with self.pool.acquire() as conn, conn.transaction():
            woken = await chunks.wake(
                conn,
                operation_id=operation_id,
                running_at_most=self.settings.chunks_per_export,
                requeue_after_seconds=self.settings.janitor_requeue_after_seconds,
            )
            for chunk_no in woken:
                await outbox.enqueue_chunk(conn, operation_id=operation_id, chunk_no=chunk_no)
            now = await chunks.chunks_of(conn, operation_id=operation_id)
        _raise_for_failed(now)
        return now


async def _assemble_file(file: Assembly, done: asyncio.Queue[Chunk | None], resume: Checkpoint | None) -> ArtifactFiles:
    """One file: add each chunk ``done`` yields, in order, until None, to one upload, begun or taken up
    from ``resume``; then finish it.
    """
    if resume is None:
        await file.start()
    else:
        file.resume(resume)
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
