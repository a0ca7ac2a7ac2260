"""How the worker sizes the ranges it reads (docs/architecture.md: How it works), with options that leave messages out,
on real Postgres: a range sized from what a filter kept would hold every message of ``export_batch_rows`` seqs
at once as soon as the filter starts to match.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from services.worker.writing.ranges import Range, RangeReader
from services.worker.writing.read_source import ReadSource
from shared.export.request import ExportRequest
from shared.settings import Settings

BODY_BYTES = 10_000


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


def reader(pool: asyncpg.Pool, settings: Settings, request: ExportRequest) -> RangeReader:
    return RangeReader(
        source=ReadSource(primary=pool),
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
    return await reader(pool, settings, request)._read_range(reads, 0, 50, 100)


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
