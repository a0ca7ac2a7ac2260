"""The files of one artifact: one object, or parts of at most ``max_part_bytes`` before compression, each a
complete file of its format (docs/api.md: Submitting an export, Export options).

Each file renders through a new renderer (``shared.export.rendering``), is gzip-compressed when asked
(every part its own gzip stream), and is written by its own ``ObjectWriter``. Parts are written one after
the other, so memory stays that of one writer whatever the number of parts.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from shared.export.formats import FileKind
from shared.export.rendering import Renderer
from shared.object_writer import ObjectWriter
from shared.repository.artifacts import StoredPart
from shared.repository.export_reader import ExportRow
from shared.settings import WorkerPartSettings
from shared.storage import part_key

# wbits for zlib's gzip container (RFC 1952) with a 32 KiB window; the header's time is 0, so the same
# messages give the same bytes.
GZIP_WBITS = 16 + zlib.MAX_WBITS


@dataclass(frozen=True)
class Destination:
    """Where and how the files of one artifact are written: under ``key`` (with ``max_part_bytes``, the folder
    of its parts, ``shared.storage.part_key``), as ``kind`` rendered for ``conversation_id``. A chunk's
    object (docs/chunks.md: Chunked exports) is a piece of one file: the format's header only when
    ``header`` (the first chunk), its footer only when ``footer`` (the last), and rendered as if
    ``previous``, the file's message before it, had come just before. A split result's chunk is ``one_file``
    under ``key``: a complete file that ends, raising ``PartFull``, where a message would take it past
    ``max_part_bytes`` (docs/chunks.md: Split results).
    """

    key: str
    kind: FileKind
    conversation_id: str
    max_part_bytes: int | None
    header: bool = True
    footer: bool = True
    previous: ExportRow | None = None
    one_file: bool = False

    @property
    def split(self) -> bool:
        """True when the artifact is parts of at most ``max_part_bytes``."""
        return self.max_part_bytes is not None and not self.one_file

    def file_key(self, number: int) -> str:
        """The key of file ``number`` (1-based): the artifact's own, or its part's."""
        return part_key(self.key, number, extension=self.kind.extension) if self.split else self.key


class PartFull(Exception):
    """A ``one_file`` destination's file is full: the message it was given, and those after, are not in it."""


class ObjectFile:
    """One object being written: rendered bytes, compressed when ``compressed``, into ``writer``."""

    def __init__(
        self, writer: ObjectWriter, renderer: Renderer, *, key: str, number: int, compressed: bool, footer: bool = True
    ) -> None:
        self.key = key
        self.number = number
        self.renderer = renderer
        self._footer = footer
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

    async def finish(self) -> StoredPart:
        """Write the footer (when the object ends the file), end the compressed stream and make the object
        visible; return it as verified.
        """
        footer = self.renderer.footer() if self._footer else b""
        self.rendered_bytes += len(footer)
        if self._compressor is not None:
            footer = self._compressor.compress(footer) + self._compressor.flush()
        await self._writer.write(footer)
        stored = await self._writer.finish()
        return StoredPart(
            self.number, self.key, stored.size_bytes, stored.sha256, self.message_count, self.first_seq, self.last_seq
        )


class FileSet:
    """The files of one artifact, written with the aiobotocore client ``s3`` to ``destination`` in the bucket
    of ``settings``, in upload parts of ``s3_part_size_bytes``. With ``destination.max_part_bytes`` a file
    that a message would take past that size (rendered, before compression, footer included) is finished
    and the message starts the next one (or, for a ``one_file`` destination, ``PartFull`` is raised).
    """

    def __init__(self, s3: Any, settings: WorkerPartSettings, destination: Destination) -> None:
        self._s3 = s3
        self._settings = settings
        self._destination = destination
        self._finished: list[StoredPart] = []
        self._current: ObjectFile | None = None
        self._latest: ObjectFile | None = None

    async def add_rows(self, rows: list[ExportRow]) -> None:
        """Render and append ``rows`` (in seq order), starting a new part where the size requires."""
        for row in rows:
            current = await self._file()
            piece = current.renderer.message(row)
            if self._outgrows(current, piece):
                if self._destination.one_file:
                    raise PartFull
                await self._finish_current()
                current = await self._file()
                piece = current.renderer.message(row)
            await current.add(piece, messages=1, first_seq=row.seq, last_seq=row.seq)

    async def add_lines(self, data: bytes) -> None:
        """Append ``data``, JSONL lines (one message each, counted by their ends) of a file that is never split."""
        assert not self._destination.split
        await (await self._file()).add(data, messages=data.count(b"\n"))

    async def finish(self) -> list[StoredPart]:
        """Finish the last file (an empty export still has one) and return every file, in order."""
        await self._file()
        await self._finish_current()
        return self._finished

    def progress(self) -> tuple[int, int]:
        """(messages, stored bytes) written so far."""
        messages = sum(done.message_count for done in self._finished)
        stored = sum(done.size_bytes for done in self._finished)
        if self._current is not None:
            messages += self._current.message_count
            stored += self._current.writer.digest().size_bytes
        return messages, stored

    def writers(self) -> list[ObjectWriter]:
        """The writer of the file being written, if any (to abandon it)."""
        return [] if self._current is None else [self._current.writer]

    @property
    def upload_id(self) -> str | None:
        """The multipart upload of the file opened last, once its writer began one (for the caller to record)."""
        return None if self._latest is None else self._latest.writer.upload_id

    def _outgrows(self, current: ObjectFile, piece: bytes) -> bool:
        # A file holds at least one message: no message is near the 5 MiB floor of max_part_bytes (the
        # body limits), so this only guards the impossible case against an endless loop.
        limit = self._destination.max_part_bytes
        if limit is None or current.message_count == 0:
            return False
        return current.rendered_bytes + len(piece) + current.renderer.footer_at_most > limit

    async def _file(self) -> ObjectFile:
        if self._current is None:
            self._current = self._latest = self._open(len(self._finished) + 1)
            if self._destination.header:
                await self._current.add(self._current.renderer.header(), messages=0)
        return self._current

    def _open(self, number: int) -> ObjectFile:
        where, settings = self._destination, self._settings
        key = where.file_key(number)
        writer = ObjectWriter.in_bucket(self._s3, settings, key=key, content_type=where.kind.content_type)
        renderer = where.kind.renderer(where.conversation_id)
        if where.previous is not None:
            renderer.continue_after(where.previous)
        return ObjectFile(
            writer, renderer, key=key, number=number, compressed=where.kind.compressed, footer=where.footer
        )

    async def _finish_current(self) -> None:
        assert self._current is not None
        self._finished.append(await self._current.finish())
        self._current = None
