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
        f"""
        UPDATE export_chunks c SET
            state = 'RUNNING', generation = c.generation + 1, lease_owner = $3,
            lease_expires_at = now() + make_interval(secs => $4),
            object_key = $5 || (c.generation + 1) || '.' || $6,
            messages_written = 0, bytes_written = 0, error_code = NULL, error_message = NULL, updated_at = now()
        FROM operations o,
             (SELECT object_key AS previous_key, lease_owner IS NOT NULL AS took_over
              FROM export_chunks WHERE operation_id = $1 AND chunk_no = $2) earlier
        WHERE c.operation_id = $1 AND c.chunk_no = $2 AND o.operation_id = c.operation_id AND o.state = 'RUNNING'
          AND c.state = ANY($7::text[]) AND (c.state <> 'RUNNING' OR c.lease_expires_at < now())
          AND (c.not_before IS NULL OR c.not_before <= now())
        RETURNING c.operation_id, c.chunk_no, c.after_seq AS range_after_seq, c.last_seq AS range_last_seq,
                  c.generation, c.attempts, c.object_key,
                  earlier.previous_key, earlier.took_over,
                  c.after_seq = (SELECT min(after_seq) FROM export_chunks WHERE operation_id = $1) AS first_chunk,
                  c.last_seq = (SELECT max(last_seq) FROM export_chunks WHERE operation_id = $1) AS last_chunk,
                  o.owner_id, o.conversation_id,
                  {", ".join(f"o.{name}" for name in FIELDS)}
        """,
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


# The fence of every write of a chunk's holder: its generation, the chunk held, the operation RUNNING.
_HELD = """
    c.operation_id = $1 AND c.chunk_no = $2 AND c.generation = $3 AND c.state = 'RUNNING'
    AND EXISTS (SELECT 1 FROM operations o WHERE o.operation_id = $1 AND o.state = 'RUNNING')
"""


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
    status = await conn.execute(
        f"""
        UPDATE export_chunks c SET lease_expires_at = now() + make_interval(secs => $4),
            messages_written = $5, bytes_written = $6, updated_at = now()
        WHERE {_HELD}
        """,
        operation_id,
        chunk_no,
        generation,
        lease_seconds,
        messages_written,
        bytes_written,
    )
    return status != "UPDATE 0"


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
    Run it in a transaction then: the operation's row is locked so that two chunks ending early at once
    number their new chunks apart.
    """
    if ended_at_seq is not None:
        await conn.execute("SELECT 1 FROM operations WHERE operation_id = $1 FOR UPDATE", operation_id)
    first, last = message_seqs or (None, None)
    count = await conn.fetchval(
        f"""
        WITH done AS (
            UPDATE export_chunks c SET state = 'DONE', size_bytes = $4, sha256 = $5, message_count = $6,
                messages_written = $6, bytes_written = $4, first_message_seq = $7, last_message_seq = $8,
                last_seq = coalesce($9::bigint, c.last_seq),
                estimated_bytes = c.estimated_bytes * (coalesce($9::bigint, c.last_seq) - c.after_seq)
                    / (c.last_seq - c.after_seq),
                lease_owner = NULL, lease_expires_at = NULL,
                updated_at = now()
            FROM export_chunks was
            WHERE was.operation_id = c.operation_id AND was.chunk_no = c.chunk_no AND {_HELD}
            RETURNING was.after_seq, was.last_seq, was.estimated_bytes),
        rest AS (
            INSERT INTO export_chunks (operation_id, chunk_no, after_seq, last_seq, estimated_bytes)
            SELECT $1, (SELECT max(chunk_no) + 1 FROM export_chunks WHERE operation_id = $1), $9, done.last_seq,
                   done.estimated_bytes * (done.last_seq - $9) / (done.last_seq - done.after_seq)
            FROM done WHERE $9 IS NOT NULL AND $9 < done.last_seq)
        SELECT count(*) FROM done
        """,
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
    return bool(count)


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
        """
        UPDATE export_chunks c SET
            attempts = c.attempts + (CASE WHEN $4::float8 IS NULL THEN 0 ELSE 1 END),
            state = CASE WHEN $4::float8 IS NOT NULL AND c.attempts + 1 >= $7 THEN 'FAILED' ELSE 'PENDING' END,
            not_before = now() + make_interval(secs => coalesce($4, 0)),
            error_code = $5, error_message = $6, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
        WHERE c.operation_id = $1 AND c.chunk_no = $2 AND c.generation = $3 AND c.state = 'RUNNING'
        RETURNING c.state
        """,
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
