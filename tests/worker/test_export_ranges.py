"""How the worker sizes the ranges it reads (docs/architecture.md: How it works), with options that leave messages out,
on real Postgres: a range sized from what a filter kept would hold every message of ``export_batch_rows`` seqs
at once as soon as the filter starts to match.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import asyncpg
import pytest

from services.worker.writing.ranges import READS_IN_FLIGHT, Range, RangeReader
from services.worker.writing.read_source import ExportReads, ReadSource
from shared.export.request import ExportRequest
from shared.repository.export_reader import ExportRow
from shared.settings import Settings

BODY_BYTES = 10_000
T = TypeVar("T")


@pytest.fixture
async def old_then_new(pool: asyncpg.Pool) -> None:
    """c-a: seqs 1-50 sent in 2020, 51-100 in 2026, bodies of ``BODY_BYTES``."""
    await pool.execute("INSERT INTO conversations (conversation_id, last_seq) VALUES ('c-a', 100)")
    await pool.execute(
        "INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at)"
        " SELECT 'c-a', n, 'm' || n, 'alice', repeat('x', $1),"
        " CASE WHEN n <= 50 THEN timestamptz '2020-01-01Z' ELSE timestamptz '2026-01-01Z' END"
        " FROM generate_series(1, 100) AS n",
        BODY_BYTES,
    )


def reader(
    pool: asyncpg.Pool, settings: Settings, request: ExportRequest, source: ReadSource | None = None
) -> RangeReader:
    return RangeReader(
        source=source or ReadSource(primary=pool),
        settings=settings,
        operation_id="op-none",
        conversation_id="c-a",
        request=request,
        kind=request.file_kind,
        split=False,
    )


async def read_range(pool: asyncpg.Pool, settings: Settings, request: ExportRequest) -> Range:
    """The range of seqs 0 < seq <= 50 as ``RangeReader`` reads it."""
    reads = await ReadSource(primary=pool).begin()
    return await reader(pool, settings, request)._read_range(reads, 0, 50)


@pytest.mark.parametrize("file_format", ["jsonl", "csv"])
async def test_a_range_a_filter_left_empty_is_sized_by_every_message_it_spans(
    pool: asyncpg.Pool, s3: Any, settings: Settings, old_then_new: None, file_format: str
) -> None:
    since = datetime(2025, 1, 1, tzinfo=UTC)
    filtered = await read_range(pool, settings, ExportRequest(format=file_format, since=since))
    unfiltered = await read_range(pool, settings, ExportRequest(format=file_format))
    assert (filtered.rows or filtered.lines) in ([], None)  # the filter kept nothing of seqs 1-50
    assert unfiltered.size * 0.9 <= filtered.size <= unfiltered.size * 1.2
    assert filtered.size >= 50 * BODY_BYTES


class FirstReadLast(ExportReads):
    """The primary's reads, the first of which answers only once the second has: as a range that Postgres
    takes longer to render than the one after it."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__(pool, None, position=None, deadline=0.0)
        self.started = 0
        self._second_done = asyncio.Event()

    async def run(self, read: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        self.started += 1
        number = self.started
        result = await super().run(read)
        if number == 1:
            await self._second_done.wait()
        elif number == 2:
            self._second_done.set()
        return result


class Collected:
    """What ``RangeReader`` hands on, in the order it hands it."""

    def __init__(self) -> None:
        self.lines = b""

    async def add_rows(self, rows: list[ExportRow]) -> None:
        raise AssertionError("a JSONL export's lines come whole")

    async def add_lines(self, data: bytes) -> None:
        self.lines += data

    def progress(self) -> tuple[int, int]:
        return self.lines.count(b"\n"), len(self.lines)


async def test_ranges_read_at_once_are_handed_on_in_seq_order(
    pool: asyncpg.Pool, settings: Settings, old_then_new: None
) -> None:
    """The next ranges are read while the files take one (``READS_IN_FLIGHT``), and a later range that is read
    first waits for the ranges before it. Reading one range at a time, the first read here would never end.
    """
    assert READS_IN_FLIGHT >= 2
    reads = FirstReadLast(pool)

    class Source(ReadSource):
        async def begin(self) -> ExportReads:
            return reads

    small_ranges = settings.model_copy(update={"export_batch_rows": 2 * READS_IN_FLIGHT})
    ranges = reader(pool, small_ranges, ExportRequest(format="jsonl"), Source(primary=pool))
    files = Collected()

    async def nothing() -> None:
        return None

    async with asyncio.timeout(30):
        await ranges.write(files, after=0, last=100, after_each=nothing)

    ids = [json.loads(line)["message_id"] for line in files.lines.splitlines()]
    assert ids == [f"m{n}" for n in range(1, 101)]
    assert reads.started > 2
