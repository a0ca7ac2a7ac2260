"""The ``export_chunks`` table (docs/chunks.md: Chunked exports): the plan of a chunked export, each chunk's
lease and fencing generation, and the outputs of finished chunks.

A chunk's claim takes its lease with the chunk's generation + 1 and names the object that generation
writes; every later write of the holder is fenced on that generation, on the chunk being RUNNING and on
the operation being RUNNING, so that neither a superseded holder nor one whose export was canceled changes
anything. The operation's lease holder (the coordinator) alone plans, wakes chunks and reads their figures.
Every function runs on the caller's connection, in the caller's transaction if any.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from shared.export.request import FIELDS, ExportRequest
from shared.repository.rows import Row
from shared.states import ACTIVE, CLAIMABLE_CHUNKS, ChunkState, State, values

# The operations whose chunks' objects must stay: running or waiting to, and parked ones, which an operator
# may requeue (a finished chunk is never redone).
_KEPT_FOR = values(ACTIVE | {State.FAILED_REPAIR})


@dataclass(frozen=True)
class PlannedRange:
    """One chunk of a plan: the seqs ``after_seq < seq <= last_seq``, about ``estimated_bytes`` of lines."""

    after_seq: int
    last_seq: int
    estimated_bytes: int


@dataclass(frozen=True)
class Chunk(Row):
    """One chunk as recorded: its range, state, lease, the object of its current generation and, once DONE,
    that object's size (bytes), sha256 (hex), message count and the seqs of its first and last message.
    """

    chunk_no: int
    after_seq: int
    last_seq: int
    estimated_bytes: int
    state: ChunkState
    generation: int
    attempts: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    object_key: str | None
    messages_written: int
    bytes_written: int
    size_bytes: int | None
    sha256: str | None
    message_count: int | None
    first_message_seq: int | None
    last_message_seq: int | None
    error_code: str | None
    error_message: str | None
    updated_at: datetime


_CHUNK_COLUMNS = ", ".join(f"c.{name}" for name in Chunk.__dataclass_fields__)


async def plan(conn: asyncpg.Connection, *, operation_id: str, generation: int, ranges: Sequence[PlannedRange]) -> int:
    """Record ``ranges`` as the chunks 1, 2, ... of ``operation_id``, fenced by the operation's lease
    (RUNNING under ``generation``, locked so that a takeover waits), unless it has a plan already; return
    how many chunks were recorded (0 when the lease is lost or a plan exists).
    """
    status = await conn.execute(
        """
        WITH held AS (
            SELECT operation_id FROM operations
            WHERE operation_id = $1 AND generation = $2 AND state = 'RUNNING' FOR UPDATE)
        INSERT INTO export_chunks (operation_id, chunk_no, after_seq, last_seq, estimated_bytes)
        SELECT held.operation_id, r.chunk_no, r.after_seq, r.last_seq, r.estimated_bytes
        FROM held, unnest($3::bigint[], $4::bigint[], $5::bigint[])
             WITH ORDINALITY AS r(after_seq, last_seq, estimated_bytes, chunk_no)
        WHERE NOT EXISTS (SELECT 1 FROM export_chunks WHERE operation_id = $1)
        """,
        operation_id,
        generation,
        [item.after_seq for item in ranges],
        [item.last_seq for item in ranges],
        [item.estimated_bytes for item in ranges],
    )
    return int(status.split()[-1])


async def chunks_of(conn: asyncpg.Connection, *, operation_id: str) -> list[Chunk]:
    """Every chunk of ``operation_id``, in seq order (none: the export is not chunked, or not planned yet)."""
    rows = await conn.fetch(
        f"SELECT {_CHUNK_COLUMNS} FROM export_chunks c WHERE c.operation_id = $1 ORDER BY c.after_seq", operation_id
    )
    return [Chunk.from_row({**row, "state": ChunkState(row["state"])}) for row in rows]


async def wake(
    conn: asyncpg.Connection, *, operation_id: str, running_at_most: int, requeue_after_seconds: float
) -> list[int]:
    """Mark QUEUED, in seq order, the chunks to wake now, so that at most ``running_at_most`` are queued or
    held; return their numbers, in seq order, for the caller to enqueue in the same transaction. Woken: a
    PENDING chunk whose retry time has come, a RUNNING one whose lease expired, and a QUEUED one whose wake-up is older
    than ``requeue_after_seconds`` (a message may be lost; a second claim of one chunk finds it held).
    """
    rows = await conn.fetch(
        """
        WITH busy AS (
            SELECT count(*) AS n FROM export_chunks
            WHERE operation_id = $1
              AND ((state = 'QUEUED' AND updated_at >= now() - make_interval(secs => $3))
                   OR (state = 'RUNNING' AND lease_expires_at >= now()))),
        due AS (
            SELECT chunk_no FROM export_chunks
            WHERE operation_id = $1
              AND ((state = 'PENDING' AND (not_before IS NULL OR not_before <= now()))
                   OR (state = 'QUEUED' AND updated_at < now() - make_interval(secs => $3))
                   OR (state = 'RUNNING' AND lease_expires_at < now()))
            ORDER BY after_seq
            LIMIT greatest($2 - (SELECT n FROM busy), 0)
            FOR UPDATE SKIP LOCKED)
        UPDATE export_chunks c SET state = 'QUEUED', updated_at = now()
        FROM due WHERE c.operation_id = $1 AND c.chunk_no = due.chunk_no
        RETURNING c.chunk_no, c.after_seq
        """,
        operation_id,
        running_at_most,
        requeue_after_seconds,
    )
    return [row["chunk_no"] for row in sorted(rows, key=lambda row: row["after_seq"])]


@dataclass(frozen=True)
class ClaimedChunk(Row):
    """A chunk whose lease a worker holds: its range (``range_after_seq < seq <= range_last_seq``), the fencing
    ``generation`` of the claim, the ``object_key`` this generation writes and ``previous_key``, the one an earlier
    generation was given (None for the first), ``took_over`` (an earlier holder's lease had expired),
    ``first_chunk`` and ``last_chunk`` (it begins or ends the file), and what the operation exports (its
    owner, conversation and request).
    """

    operation_id: str
    chunk_no: int
    range_after_seq: int
    range_last_seq: int
    generation: int
    attempts: int
    object_key: str
    previous_key: str | None
    took_over: bool
    first_chunk: bool
    last_chunk: bool
    owner_id: str
    conversation_id: str
    request: ExportRequest

    def log_extra(self, **more: Any) -> dict[str, Any]:
        """The fields every log line about this chunk carries, and ``more``."""
        return {"operation_id": self.operation_id, "chunk": self.chunk_no, "chunk_generation": self.generation, **more}


# A claim's row (claim_chunk_v1, migration 0021): the chunk's range, lease and object, what the earlier
# generation left, the chunk's place in the plan, and the operation's owner and request.
_CLAIMED = ", ".join(
    [
        "(c.chunk).operation_id, (c.chunk).chunk_no, (c.chunk).after_seq AS range_after_seq",
        "(c.chunk).last_seq AS range_last_seq, (c.chunk).generation, (c.chunk).attempts, (c.chunk).object_key",
        "c.previous_key, c.took_over, c.first_chunk, c.last_chunk",
        "(c.operation).owner_id, (c.operation).conversation_id",
        *(f"(c.operation).{name}" for name in FIELDS),
    ]
)


async def claim(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    chunk_no: int,
    worker_id: str,
    lease_seconds: float,
    key_stem: str,
    extension: str,
) -> ClaimedChunk | None:
    """Take the lease of chunk ``chunk_no`` of a RUNNING operation with the chunk's generation + 1; its object
    is ``<key_stem><generation>.<extension>``. None when the chunk is DONE or FAILED, held by a live lease,
    waiting for its retry time, or its operation is not RUNNING (a cancel reaches every chunk).
    """
    row = await conn.fetchrow(
        f"SELECT {_CLAIMED} FROM claim_chunk_v1($1, $2, $3, $4, $5, $6, $7) c WHERE (c.chunk).operation_id IS NOT NULL",
        operation_id,
        chunk_no,
        worker_id,
        lease_seconds,
        key_stem,
        extension,
        values(CLAIMABLE_CHUNKS),
    )
    return None if row is None else ClaimedChunk.from_row({**row, "request": ExportRequest.from_row(row)})


async def claim_visible(conn: asyncpg.Connection, *, operation_id: str, chunk_no: int, generation: int) -> bool:
    """Whether ``conn``'s server shows chunk ``chunk_no`` under ``generation``: asked of a standby before a chunk
    reads there, as ``leases.claim_visible`` (docs/deploy.md: Export reads on a hot standby).
    """
    found: bool = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM export_chunks WHERE operation_id = $1 AND chunk_no = $2 AND generation = $3)",
        operation_id,
        chunk_no,
        generation,
    )
    return found


async def extend(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    chunk_no: int,
    generation: int,
    lease_seconds: float,
    messages_written: int,
    bytes_written: int,
) -> bool:
    """Heartbeat and progress of a chunk's holder: push its lease end to now + ``lease_seconds`` and record
    its counts so far; False when the lease is lost or the export is no longer RUNNING.
    """
    extended: bool = await conn.fetchval(
        "SELECT extend_chunk_v1($1, $2, $3, $4, $5, $6)",
        operation_id,
        chunk_no,
        generation,
        lease_seconds,
        messages_written,
        bytes_written,
    )
    return extended


async def finish(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    chunk_no: int,
    generation: int,
    size_bytes: int,
    sha256: str,
    message_count: int,
    message_seqs: tuple[int, int] | None,
    ended_at_seq: int | None = None,
) -> bool:
    """Record the holder's verified output (``size_bytes``, hex ``sha256``, ``message_count``, the seqs of its
    first and last message or None) and make the chunk DONE; False, recording nothing, when the lease is lost
    or the export is no longer RUNNING.

    ``ended_at_seq``: the output ends at that seq, short of the range (a split result's part is full,
    docs/chunks.md: Split results): the chunk's range ends there and the rest becomes a new PENDING chunk.
    The operation's row is locked then, so that two chunks ending early at once number their new chunks apart
    (``finish_chunk_v1``, one statement).
    """
    first, last = message_seqs or (None, None)
    finished: bool = await conn.fetchval(
        "SELECT finish_chunk_v1($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        operation_id,
        chunk_no,
        generation,
        size_bytes,
        sha256,
        message_count,
        first,
        last,
        ended_at_seq,
    )
    return finished


async def release(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    chunk_no: int,
    generation: int,
    retry_delay_seconds: float | None,
    error_code: str | None = None,
    error_message: str | None = None,
    max_attempts: int | None = None,
) -> ChunkState | None:
    """End the holder's lease: with ``retry_delay_seconds`` None, hand it back (a shutdown: PENDING, no
    attempt spent); else count a failed attempt: PENDING again after the delay, or FAILED with the error once
    ``max_attempts`` are spent. Returns the new state, None when the lease was no longer held.
    """
    state = await conn.fetchval(
        "SELECT release_chunk_v1($1, $2, $3, $4, $5, $6, $7)",
        operation_id,
        chunk_no,
        generation,
        retry_delay_seconds,
        error_code,
        error_message,
        max_attempts or 0,
    )
    return None if state is None else ChunkState(state)


async def retry_failed(conn: asyncpg.Connection, *, operation_id: str) -> int:
    """Make the FAILED chunks of ``operation_id`` PENDING with a new attempt budget: a new attempt of the
    operation (an operator's requeue of a parked export) tries them again. Returns how many.
    """
    status = await conn.execute(
        """
        UPDATE export_chunks SET state = 'PENDING', attempts = 0, not_before = NULL, updated_at = now()
        WHERE operation_id = $1 AND state = 'FAILED'
        """,
        operation_id,
    )
    return int(status.split()[-1])


async def object_keys(conn: asyncpg.Connection, *, operation_id: str) -> list[str]:
    """The objects the chunks of ``operation_id`` name (each chunk's current generation's)."""
    rows = await conn.fetch(
        "SELECT object_key FROM export_chunks WHERE operation_id = $1 AND object_key IS NOT NULL ORDER BY after_seq",
        operation_id,
    )
    return [row["object_key"] for row in rows]


async def kept_keys(conn: asyncpg.Connection, *, object_keys: list[str]) -> dict[str, ChunkState]:
    """Of ``object_keys``, those a chunk of an export still running or parked names, with the chunk's state:
    the janitor must leave them (a finished chunk is never redone). A key of a superseded chunk generation,
    or of an ended export's chunk, is not among them.
    """
    rows = await conn.fetch(
        """
        SELECT c.object_key, c.state FROM export_chunks c JOIN operations o USING (operation_id)
        WHERE c.object_key = ANY($1::text[]) AND o.state = ANY($2::text[])
        """,
        object_keys,
        _KEPT_FOR,
    )
    return {row["object_key"]: ChunkState(row["state"]) for row in rows}


async def chunk_figures(conn: asyncpg.Connection) -> dict[ChunkState, int]:
    """How many chunks of exports still running or parked are in each state (for the gauges)."""
    rows = await conn.fetch(
        """
        SELECT c.state, count(*) AS n FROM export_chunks c JOIN operations o USING (operation_id)
        WHERE o.state = ANY($1::text[]) GROUP BY c.state
        """,
        _KEPT_FOR,
    )
    return {ChunkState(row["state"]): row["n"] for row in rows}
