"""A read that a standby cancels part-way hands nothing on (docs/deploy.md: Export reads on a hot standby): on the
real Postgres and a moto server, a standby whose read fails for a recovery conflict after every possible number
of rows of every range, in every format, with and without gzip, leaves a file byte for byte that of reads on the
primary alone.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest

from services.worker.writing.files import Destination, FileSet
from services.worker.writing.ranges import READS_IN_FLIGHT, RangeReader
from services.worker.writing.read_source import ReadSource
from shared.export.formats import COMPRESSIONS, FORMATS
from shared.export.request import ExportRequest
from shared.settings import Settings

# Seven messages read three seqs at a time: ranges of 3, 3 and 1 messages.
MESSAGES = 7
RANGE_SEQS = 3
RANGES = 3
# Bodies that every format escapes or quotes in its own way, so that a line written twice or cut short shows.
BODIES = ["plain", 'quote " and, comma', "line\nbreak", "<b>&amp;</b>", "ünïcödé 你好", "tab\there", "\x1b[31mred"]


@pytest.fixture
async def conversation(pool: asyncpg.Pool) -> None:
    """c-a with alice as member and ``MESSAGES`` messages of ``BODIES``."""
    await pool.execute("INSERT INTO conversations (conversation_id, last_seq) VALUES ('c-a', $1)", MESSAGES)
    await pool.execute("INSERT INTO conversation_members (conversation_id, user_id) VALUES ('c-a', 'alice')")
    await pool.executemany(
        "INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at)"
        " VALUES ('c-a', $1, $2, 'alice', $3, timestamptz '2026-11-30T08:00:00Z' + make_interval(mins => $4))",
        [(seq, f"m{seq}", body, seq) for seq, body in enumerate(BODIES, start=1)],
    )


class Conflict(asyncpg.SerializationError):
    """What a standby raises when it cancels a read for a recovery conflict (SQLSTATE 40001)."""


class FailingConnection:
    """A connection to the test's own database, which has replayed everything, as a standby would show it. When
    ``fails`` it hands ``rows`` rows of its read on (``rows`` past the range's own: all of them), then raises
    ``Conflict``.
    """

    def __init__(self, conn: asyncpg.Connection, *, fails: bool, rows: int) -> None:
        self._conn = conn
        self._fails = fails
        self._rows = rows
        self._handed = 0

    async def fetchval(self, query: str, *args: Any) -> Any:
        if "pg_is_in_recovery" in query:
            return True  # caught up with the claim
        if self._fails:
            raise Conflict("canceling statement due to conflict with recovery")
        return await self._conn.fetchval(query, *args)

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        # asyncpg hands a fetch's rows on only once the statement has ended: a failure after any row is this one.
        rows = await self._conn.fetch(query, *args)
        if self._fails:
            raise Conflict("canceling statement due to conflict with recovery")
        return rows

    async def copy_from_query(
        self, query: str, *args: Any, output: Callable[[bytes], Awaitable[None]], **options: Any
    ) -> None:
        # The statement runs to its end and what comes after the allowed rows is dropped, then the read fails:
        # to ``output`` that is a server that cancelled the COPY part-way. (Raising inside the sink instead would
        # leave asyncpg's connection waiting for a cancellation that never comes.)
        async def some_lines(data: bytes) -> None:
            lines = data.splitlines(keepends=True)
            allowed = len(lines) if not self._fails else max(0, min(len(lines), self._rows - self._handed))
            self._handed += allowed
            if allowed:
                await output(b"".join(lines[:allowed]))

        await self._conn.copy_from_query(query, *args, output=some_lines, **options)
        if self._fails:
            raise Conflict("canceling statement due to conflict with recovery")


class FailingStandby:
    """A standby pool whose read number ``failing_read`` (0-based) fails after ``rows`` rows."""

    def __init__(self, pool: asyncpg.Pool, *, failing_read: int, rows: int) -> None:
        self._pool = pool
        self._failing_read = failing_read
        self._rows = rows
        self.reads = 0

    def get_idle_size(self) -> int:
        return self._pool.get_idle_size()

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[FailingConnection]:
        async with self._pool.acquire() as conn:
            fails = self.reads == self._failing_read
            self.reads += 1
            yield FailingConnection(conn, fails=fails, rows=self._rows)


async def export(s3: Any, settings: Settings, source: ReadSource, request: ExportRequest, key: str) -> str:
    """Read c-a through ``source`` into one file at ``key``; its sha256."""
    kind = request.file_kind
    files = FileSet(s3, settings, Destination(key, kind, "c-a", None))
    reader = RangeReader(
        source=source,
        settings=settings,
        operation_id="op-none",
        conversation_id="c-a",
        request=request,
        kind=kind,
        split=False,
    )

    async def nothing() -> None:
        return None

    await reader.write(files, after=0, last=MESSAGES, after_each=nothing)
    (stored,) = await files.finish()
    return stored.sha256


@pytest.mark.parametrize(("file_format", "compression"), list(itertools.product(FORMATS, COMPRESSIONS)))
async def test_a_standby_read_failing_after_any_row_of_any_range_leaves_the_file_of_the_primary(
    pool: asyncpg.Pool, s3: Any, settings: Settings, conversation: None, file_format: str, compression: str
) -> None:
    settings = settings.model_copy(update={"export_batch_rows": RANGE_SEQS * READS_IN_FLIGHT})
    request = ExportRequest(format=file_format, compression=compression)
    expected = await export(s3, settings, ReadSource(primary=pool), request, "exports/op/primary")

    cases = [(failing, rows) for failing in range(RANGES) for rows in range(RANGE_SEQS + 2)]
    for failing, rows in cases:
        standby = FailingStandby(pool, failing_read=failing, rows=rows)
        source = ReadSource(primary=pool, standby=standby, wait_seconds=1.0)
        got = await export(s3, settings, source, request, f"exports/op/r{failing}-{rows}")
        assert (failing, rows, got) == (failing, rows, expected)
        # The failed read and those begun after it went to the primary; the standby served every read before
        # it, and may have served one begun beside it (``READS_IN_FLIGHT``), which was already on its way.
        assert failing + 1 <= standby.reads <= min(failing + READS_IN_FLIGHT, RANGES)
