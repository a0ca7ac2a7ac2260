"""Whether an attempt's export is written in chunks, and which (docs/chunks.md: Chunked exports): the
operation's lease holder plans the chunks at the first claim that finds the export big enough; every later
generation keeps that plan (the same snapshot, the same ranges).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import asyncpg

from services.worker.writing.read_source import ReadSource
from shared.lease import LeaseLost
from shared.repository import chunks, export_reader
from shared.repository.chunks import Chunk, PlannedRange
from shared.repository.leases import ClaimedOperation
from shared.settings import MAX_CHUNKS, WorkerPartSettings
from shared.states import ChunkState

# A split result's chunks are planned at this share of max_part_bytes: the plan estimates JSONL lines, and
# a chunk whose rendering outgrows the part ends early, leaving the rest of its range to a new chunk.
SPLIT_CHUNK_SHARE = 0.75


@dataclass(kw_only=True)
class ChunkPlanner:
    """Plans the chunks of one attempt for ``claimed``, whose snapshot ends at ``last_seq``; the plan weighs
    the messages through ``reads`` (the standby or the primary, ``services.worker.writing.read_source``).
    """

    pool: asyncpg.Pool
    settings: WorkerPartSettings
    claimed: ClaimedOperation
    last_seq: int
    reads: ReadSource

    async def plan(self) -> list[Chunk]:
        """The export's chunks: those an earlier generation planned (FAILED ones made PENDING again: this is
        a new attempt), or a new plan when the messages are estimated above ``chunk_threshold_bytes``;
        empty when the export is written in one stream. Raises ``LeaseLost`` when the plan's fence fails.
        """
        claimed = self.claimed
        after = claimed.request.after_seq
        # A small export costs no query: the same snapshot and settings never planned it either.
        if self.settings.chunk_threshold_bytes <= 0 or not self._may_exceed_threshold(self.last_seq - after):
            return []
        async with self.pool.acquire() as conn:
            existing = await chunks.chunks_of(conn, operation_id=claimed.operation_id)
            if existing:
                if any(chunk.state == ChunkState.FAILED for chunk in existing):
                    await chunks.retry_failed(conn, operation_id=claimed.operation_id)
                return await chunks.chunks_of(conn, operation_id=claimed.operation_id)
        # Weighing reads every message of the export: not on the primary when a standby can serve it.
        ranges = await (await self.reads.begin()).run(self._weigh)
        if len(ranges) < 2:
            return []
        async with self.pool.acquire() as conn:
            if not await chunks.plan(
                conn, operation_id=claimed.operation_id, generation=claimed.generation, ranges=ranges
            ):
                raise LeaseLost("plan")
            return await chunks.chunks_of(conn, operation_id=claimed.operation_id)

    async def _weigh(self, conn: asyncpg.Connection) -> list[PlannedRange]:
        """The ranges of the chunks the messages the export writes would make (its filters applied: a chunk
        holds about its share of the file, and a split result's part about a part's worth); none when they are
        estimated at or below ``chunk_threshold_bytes``.
        """
        request = self.claimed.request
        conversation_id, after = self.claimed.conversation_id, request.after_seq
        total = await export_reader.range_bytes(
            conn,
            conversation_id=conversation_id,
            after_seq=after,
            last_seq=self.last_seq,
            recalled=False,
            request=request,
        )
        if total <= self.settings.chunk_threshold_bytes:
            return []
        return await export_reader.plan_ranges(
            conn,
            conversation_id=conversation_id,
            after_seq=after,
            last_seq=self.last_seq,
            target_bytes=self._target_bytes(total),
            request=request,
        )

    def _target_bytes(self, total: int) -> int:
        """The estimated bytes of each chunk of ``total``: ``chunk_target_bytes``, more when the chunks of one
        upload would be too many, less for a split result's parts.
        """
        max_part_bytes = self.claimed.request.max_part_bytes
        target = self.settings.chunk_target_bytes
        if max_part_bytes is not None:
            target = min(target, int(max_part_bytes * SPLIT_CHUNK_SHARE))
        return max(target, math.ceil(total / MAX_CHUNKS))

    def _may_exceed_threshold(self, seqs: int) -> bool:
        """False when ``seqs`` messages cannot reach the threshold even at the largest body a message may
        have: a small export then costs no estimate at all.
        """
        settings = self.settings
        largest = (
            max(settings.message_body_max_bytes, settings.import_body_max_bytes) + export_reader.LINE_OVERHEAD_BYTES
        )
        return seqs * largest > settings.chunk_threshold_bytes
