"""Reading an export's messages range by range into its files: what one attempt of a whole export and one
chunk of a chunked export (docs/chunks.md: Chunked exports) both do with their seqs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import asyncpg

from services.worker import metrics
from services.worker.writing.read_source import ExportReads, ReadSource
from shared.export.formats import FileKind
from shared.export.request import ExportRequest
from shared.repository import export_reader
from shared.settings import WorkerPartSettings

# Seqs in the first range an attempt reads, before it knows how many bytes a seq takes.
FIRST_RANGE_SEQS = 1000
# Ranges read at once while the files take the one before: Postgres renders each range's lines in one backend,
# so a second read keeps a second one busy (docs/benchmark.md: The read of an export's lines). A read beyond the
# first waits for an idle connection of the pool rather than open one.
READS_IN_FLIGHT = 2


@dataclass(frozen=True)
class Range:
    """The selected messages of seqs ``low < seq <= high``: as JSONL ``lines`` (Postgres' rendering, whole
    lines), or as ``rows``; ``size`` (bytes) sizes the next range (``RangeReader._read_range``).
    """

    low: int
    high: int
    size: int
    lines: list[bytes] = field(default_factory=list)
    rows: list[export_reader.ExportRow] | None = None


class Files(Protocol):
    """What the read ranges go to: the files of an artifact (``services.worker.writing.files.FileSet``) or the
    file inside a ZIP (``services.worker.writing.media_zip``)."""

    async def add_rows(self, rows: list[export_reader.ExportRow]) -> None: ...

    async def add_lines(self, data: bytes) -> None: ...

    def progress(self) -> tuple[int, int]: ...


class RangeReader:
    """Reads the messages ``request`` selects in ``conversation_id`` through ``source`` (the standby or the
    primary, ``services.worker.writing.read_source``), as of the edit snapshot of export ``operation_id``, for
    files of ``kind`` (``split``: parts of at most ``max_part_bytes``).
    """

    def __init__(
        self,
        *,
        source: ReadSource,
        settings: WorkerPartSettings,
        operation_id: str,
        conversation_id: str,
        request: ExportRequest,
        kind: FileKind,
        split: bool,
    ) -> None:
        self._source = source
        self._settings = settings
        self._operation_id = operation_id
        self._conversation_id = conversation_id
        self._request = request
        # Postgres renders JSONL lines itself; other formats, and parts (which need each message's seq and
        # size), render message by message.
        self._by_row = not kind.postgres_renders or split

    async def write(self, files: Files, *, after: int, last: int, after_each: Callable[[], Awaitable[None]]) -> None:
        """Hand the messages of seqs ``after < seq <= last`` to ``files`` range by range, in seq order, each
        once its statement has ended, reading the next ``READS_IN_FLIGHT`` ranges while the files take the
        current one; await ``after_each()`` after each range (where a holder records progress and notices a
        lost lease).

        A range is collected in memory rather than streamed from Postgres into the writer: waiting for a slow
        S3 inside the statement would hold its snapshot open and run into the statement timeout. To keep
        the ranges read at once near one part whatever the messages' size, each range is sized from the bytes
        per seq of the one before (``_next_span``; the first ones ``FIRST_RANGE_SEQS``).
        """
        if after >= last:
            return
        reads = await self._source.begin()
        reading: collections.deque[asyncio.Task[Range]] = collections.deque()
        span, low = min(FIRST_RANGE_SEQS, self._most_seqs()), after

        def read_ahead() -> None:
            nonlocal low
            while low < last and (not reading or (len(reading) < READS_IN_FLIGHT and reads.spare_connection())):
                high = min(low + span, last)
                reading.append(asyncio.create_task(self._read_range(reads, low, high)))
                low = high

        try:
            read_ahead()
            while reading:
                current = await reading.popleft()
                span = self._next_span(seqs=current.high - current.low, size=current.size)
                read_ahead()
                handed = files.progress()[1]
                await _take(files, current)
                metrics.EXPORTED_BYTES.inc(files.progress()[1] - handed)
                await after_each()
        finally:
            for task in reading:
                task.cancel()
            for task in reading:
                with contextlib.suppress(BaseException):
                    await task
            reads.finish()

    async def _read_range(self, reads: ExportReads, low: int, high: int) -> Range:
        """The selected messages of seqs ``low < seq <= high``.

        With options that leave messages out, the range's ``size`` is that of all its messages, not of those
        selected: sizing the next range from what a filter kept (nothing, in a range older than ``since``)
        would make it hold every message of ``export_batch_rows`` seqs at once.
        """
        return await reads.run(lambda conn: self._read_on(conn, low, high))

    async def _read_on(self, conn: asyncpg.Connection, low: int, high: int) -> Range:
        """``_read_range``'s statements on ``conn``: nothing is handed on before they have all ended."""
        cid, request, shown_as_of = self._conversation_id, self._request, self._operation_id
        if self._by_row:
            rows = await export_reader.fetch_export_rows(
                conn, operation_id=shown_as_of, conversation_id=cid, after_seq=low, last_seq=high, request=request
            )
            selected = sum(len(row.line) for row in rows)
            lines: list[bytes] = []
        else:
            rows = None
            data = await export_reader.fetch_export_lines(
                conn, operation_id=shown_as_of, conversation_id=cid, after_seq=low, last_seq=high, request=request
            )
            lines = [data] if data else []
            selected = len(data)
        size = (
            await export_reader.range_bytes(conn, conversation_id=cid, after_seq=low, last_seq=high)
            if request.selects_messages
            else selected
        )
        return Range(low, high, size, lines=lines, rows=rows)

    def _next_span(self, *, seqs: int, size: int) -> int:
        """Seqs for about one part of lines among the ``READS_IN_FLIGHT`` ranges read at once, at most a share
        as large of ``export_batch_rows``, judged from the last range's ``size`` bytes over ``seqs`` seqs.
        """
        bytes_per_seq = max(size / seqs, 1.0)
        span = int(self._settings.s3_part_size_bytes / READS_IN_FLIGHT / bytes_per_seq)
        return max(1, min(span, self._most_seqs()))

    def _most_seqs(self) -> int:
        """A range's share of ``export_batch_rows``, the most seqs read at once."""
        return max(1, self._settings.export_batch_rows // READS_IN_FLIGHT)


async def _take(files: Files, current: Range) -> None:
    if current.rows is not None:
        await files.add_rows(current.rows)
    for chunk in current.lines:
        await files.add_lines(chunk)
