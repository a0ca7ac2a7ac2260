"""The files of one artifact: one object, or parts of at most ``max_part_bytes`` before compression, each a
complete file of its format (README: API reference, Export options).

Each file renders through a new renderer (``shared.rendering``), is gzip-compressed when asked
(every part its own gzip stream), and is written by its own ``ObjectWriter``. Parts are written one after
the other, so memory stays that of one writer whatever the number of parts.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

from services.worker.object_writer import Digest, ObjectWriter
from shared.rendering import Renderer
from shared.repository.conversations import ExportRow

# wbits for zlib's gzip container (RFC 1952) with a 32 KiB window; the header's time is 0, so the same
# messages give the same bytes.
GZIP_WBITS = 16 + zlib.MAX_WBITS


@dataclass(frozen=True)
class WrittenFile:
    """A finished file: its ``key``, 1-based ``number``, what was ``written`` (stored bytes), and the
    messages it holds with their first and last seq (None when it holds none).
    """

    key: str
    number: int
    written: Digest
    message_count: int
    first_seq: int | None
    last_seq: int | None


class ObjectFile:
    """One object being written: rendered bytes, compressed when ``compressed``, into ``writer``."""

    def __init__(self, writer: ObjectWriter, renderer: Renderer, *, key: str, number: int, compressed: bool) -> None:
        self.key = key
        self.number = number
        self.renderer = renderer
        self._writer = writer
        self._compressor = zlib.compressobj(wbits=GZIP_WBITS) if compressed else None
        self.rendered_bytes = 0
        self.message_count = 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None

    @property
    def writer(self) -> ObjectWriter:
        """The writer of the stored bytes."""
        return self._writer

    async def add(
        self, data: bytes, *, messages: int, first_seq: int | None = None, last_seq: int | None = None
    ) -> None:
        """Append ``data``, the rendering of ``messages`` messages (seqs ``first_seq`` to ``last_seq`` when known)."""
        self.rendered_bytes += len(data)
        self.message_count += messages
        if self.first_seq is None:
            self.first_seq = first_seq
        self.last_seq = last_seq if last_seq is not None else self.last_seq
        await self._writer.write(self._compressor.compress(data) if self._compressor else data)

    async def finish(self) -> WrittenFile:
        """Write the footer, end the compressed stream and make the object visible."""
        footer = self.renderer.footer()
        self.rendered_bytes += len(footer)
        if self._compressor is not None:
            footer = self._compressor.compress(footer) + self._compressor.flush()
        await self._writer.write(footer)
        written = await self._writer.finish()
        return WrittenFile(self.key, self.number, written, self.message_count, self.first_seq, self.last_seq)


class FileSet:
    """The files of one artifact. ``open_file(number)`` starts file ``number`` (its header written by the
    caller through ``ObjectFile.add``); with ``max_part_bytes`` a file that a message would take past that
    size (rendered, before compression, footer included) is finished and the message starts the next one.
    """

    def __init__(self, open_file: Callable[[int], ObjectFile], *, max_part_bytes: int | None) -> None:
        self._open_file = open_file
        self._max_part_bytes = max_part_bytes
        self._finished: list[WrittenFile] = []
        self._current: ObjectFile | None = None

    async def add_rows(self, rows: list[ExportRow]) -> None:
        """Render and append ``rows`` (in seq order), starting a new part where the size requires."""
        for row in rows:
            current = await self._file()
            piece = current.renderer.message(row)
            if self._outgrows(current, piece):
                await self._finish_current()
                current = await self._file()
                piece = current.renderer.message(row)
            await current.add(piece, messages=1, first_seq=row.seq, last_seq=row.seq)

    async def add_lines(self, data: bytes) -> None:
        """Append ``data``, JSONL lines (one message each, counted by their ends) of a file that is never split."""
        assert self._max_part_bytes is None
        await (await self._file()).add(data, messages=data.count(b"\n"))

    async def finish(self) -> list[WrittenFile]:
        """Finish the last file (an empty export still has one) and return every file, in order."""
        await self._file()
        await self._finish_current()
        return self._finished

    def progress(self) -> tuple[int, int]:
        """(messages, stored bytes) written so far."""
        messages = sum(done.message_count for done in self._finished)
        stored = sum(done.written.size_bytes for done in self._finished)
        if self._current is not None:
            messages += self._current.message_count
            stored += self._current.writer.digest().size_bytes
        return messages, stored

    def writers(self) -> list[ObjectWriter]:
        """The writer of the file being written, if any (to abandon it)."""
        return [] if self._current is None else [self._current.writer]

    def _outgrows(self, current: ObjectFile, piece: bytes) -> bool:
        # A file holds at least one message: no message is near the 5 MiB floor of max_part_bytes (the
        # body limits), so this only guards the impossible case against an endless loop.
        limit = self._max_part_bytes
        if limit is None or current.message_count == 0:
            return False
        return current.rendered_bytes + len(piece) + current.renderer.footer_at_most > limit

    async def _file(self) -> ObjectFile:
        if self._current is None:
            self._current = self._open_file(len(self._finished) + 1)
            await self._current.add(self._current.renderer.header(), messages=0)
        return self._current

    async def _finish_current(self) -> None:
        assert self._current is not None
        self._finished.append(await self._current.finish())
        self._current = None
