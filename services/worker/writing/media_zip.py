"""Writing an export with media: one ZIP streamed into its object (docs/api.md: Submitting an export, Exports
with media), built by ``stream-zip`` rather than a ZIP writer of our own.

The members, in order:

- every attachment the plan includes (``shared.export.media``), as ``media/<attachment id>/<safe name>``,
  stored as it was uploaded, without recompression: its size and CRC-32, recorded at upload, go in its local
  header, so it needs no data descriptor, which strict streaming readers refuse for stored members; ZIP64 where
  its size or offset needs it. ``stream-zip`` checks its bytes on the way against that size and CRC-32;
- the chosen format's file, deflated, its messages showing where their files went: it comes after the media,
  so a file the bucket no longer holds is known ``unavailable`` before a message says so;
- ``manifest.json``: every member before it with its size and SHA-256, and every attachment left out with why.

Memory stays bounded whatever the sizes: a file is streamed from the bucket in chunks, the messages one range at
a time, and the object writer holds about two upload parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol, TypeVar

from botocore.exceptions import ClientError
from stream_zip import NO_COMPRESSION_32, NO_COMPRESSION_64, ZIP_64, async_stream_zip

from services.worker.writing.ranges import Files
from shared.export.formats import FileKind
from shared.export.media import MANIFEST_NAME, MediaPlan, left_out_entries, safe_name, with_media
from shared.object_writer import Digest
from shared.repository.artifacts import StoredPart
from shared.repository.export_reader import CarriedAttachment, ExportRow
from shared.storage import is_missing

T = TypeVar("T")
# A stored member whose local header offset or size reaches this needs ZIP64 (the 32-bit fields' largest value
# means "see the ZIP64 extra field").
ZIP32_LIMIT = 0xFFFFFFFF
# What a member's local header takes besides its name, at most: 30 bytes of fixed fields and the ZIP64 and
# extended timestamp extra fields.
LOCAL_HEADER_BYTES = 30 + 20 + 9
# Bytes read from the bucket at a time, and the ZIP's output chunks.
MEDIA_CHUNK_BYTES = 1024 * 1024
ZIP_CHUNK_BYTES = 1024 * 1024
# Rendered ranges waiting for the ZIP: the reader stays at most this far ahead.
QUEUED_RANGES = 2
# Read permission for everyone, write for the owner: what unzip gives the files it extracts.
MEMBER_MODE = 0o100644


class MessageReader(Protocol):
    """What reads the messages into the ZIP's file (``services.worker.writing.ranges.RangeReader``)."""

    async def write(
        self, files: Files, *, after: int, last: int, after_each: Callable[[], Awaitable[None]]
    ) -> None: ...


class ZipWriter(Protocol):
    """Where the ZIP's bytes go (``shared.object_writer.ObjectWriter``)."""

    async def write(self, data: bytes) -> None: ...

    async def finish(self) -> Digest: ...

    def digest(self) -> Digest: ...


class MediaZip:
    """Writes one ZIP, the object ``key`` of ``bucket``, of ``kind``'s file of ``conversation_id`` (read by
    ``reader``) with the media of ``plan`` (``carried``, the attachments in the order the plan saw them) into
    ``writer``. ``modified_at`` dates the file and the manifest (the attachments keep their upload's time);
    ``force_zip64`` writes every stored member as ZIP64 (the tests' way to check those headers on small files).
    """

    def __init__(
        self,
        *,
        s3: Any,
        bucket: str,
        key: str,
        kind: FileKind,
        conversation_id: str,
        reader: MessageReader,
        writer: ZipWriter,
        plan: MediaPlan,
        carried: list[CarriedAttachment],
        modified_at: datetime,
        force_zip64: bool = False,
    ) -> None:
        self._s3 = s3
        self._bucket = bucket
        self._key = key
        self._kind = kind
        self._conversation_id = conversation_id
        self._reader = reader
        self._writer = writer
        self._plan = plan
        self._carried = carried
        self._modified_at = modified_at
        self._force_zip64 = force_zip64
        self._offset_bound = 0
        self._begun: list[asyncio.Task[Any]] = []
        # The response of the file being streamed, whose generator stream-zip holds.
        self._streaming: Any = None
        self._after_each: Callable[[], Awaitable[None]] = _nothing
        # Deflate never makes the file much bigger than it is (zlib's bound is a few bytes per 16 KiB): this bounds
        # the bytes its member takes, once it is written.
        self._messages_bound = 0
        self._manifest: list[dict[str, Any]] = []
        self.message_count = 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None

    @property
    def file_name(self) -> str:
        """The format's file in the ZIP: the conversation's id made safe, with the format's extension."""
        return f"{safe_name(self._conversation_id)}.{self._kind.format}"

    def progress(self) -> tuple[int, int]:
        """(messages rendered, ZIP bytes stored) so far."""
        return self.message_count, self._writer.digest().size_bytes

    async def write(self, *, after: int, last: int, after_each: Callable[[], Awaitable[None]]) -> StoredPart:
        """Write the ZIP of the messages of seqs ``after < seq <= last`` and the media, awaiting ``after_each()``
        after each range of messages; return it as verified (``ObjectWriter.finish``). Raises ``stream-zip``'s
        integrity errors when a file in the bucket is not the one its upload measured, the storage's and the
        database's errors.
        """
        self._after_each = after_each
        members = self._members(after=after, last=last, after_each=after_each)
        try:
            async for chunk in async_stream_zip(members, chunk_size=ZIP_CHUNK_BYTES):
                await self._writer.write(chunk)
        except BaseException:
            # On a failure or a stop, what the members began goes now, not when they are collected: the
            # messages' renderer, the file being streamed and the GET begun for the next one.
            for task in self._begun:
                _close_unread(task)
            if self._streaming is not None:
                self._streaming["Body"].close()
            raise
        stored = await self._writer.finish()
        return StoredPart(
            1, self._key, stored.size_bytes, stored.sha256, self.message_count, self.first_seq, self.last_seq
        )

    async def _members(
        self, *, after: int, last: int, after_each: Callable[[], Awaitable[None]]
    ) -> AsyncIterator[tuple[str, datetime, int, Any, AsyncIterator[bytes]]]:
        included = [item for item in self._carried if item.attachment_id in self._plan.included]
        # The next file's GET is in flight while the current one streams: 2,000 small files otherwise wait
        # out 2,000 round trips one after the other (docs/benchmark.md: Exports with media).
        opening = self._open(included[0]) if included else None
        try:
            for number, attachment in enumerate(included):
                assert opening is not None
                response = await opening
                self._begun.remove(opening)
                self._streaming = response
                opening = self._open(included[number + 1]) if number + 1 < len(included) else None
                if response is None:
                    self._plan.mark_unavailable(attachment.attachment_id, attachment.size_bytes)
                    continue
                path = self._plan.included[attachment.attachment_id]
                size, crc32 = attachment.size_bytes, attachment.crc32
                self._offset_bound += LOCAL_HEADER_BYTES + len(path.encode()) + size
                method = stored_method(size, self._offset_bound, force=self._force_zip64)
                yield (
                    path,
                    attachment.created_at,
                    MEMBER_MODE,
                    method(size, crc32),
                    self._stored_file(response, attachment, path),
                )
        finally:
            if opening is not None:
                _close_unread(opening)
        yield self.file_name, self._modified_at, MEMBER_MODE, ZIP_64, self._messages(after, last, after_each)
        manifest = manifest_bytes(self._manifest, left_out_entries(self._plan, self._carried))
        # The messages' file may be as big as the media: bound the manifest's offset by both.
        self._offset_bound += LOCAL_HEADER_BYTES + len(self.file_name.encode()) + self._messages_bound
        end = self._offset_bound + LOCAL_HEADER_BYTES + len(MANIFEST_NAME) + len(manifest)
        yield manifest_member(manifest, self._modified_at, end=end, force=self._force_zip64)

    def _open(self, attachment: CarriedAttachment) -> asyncio.Task[Any]:
        """The GET of ``attachment``'s object, begun: its response, or None when the bucket no longer holds it."""

        async def get() -> Any:
            try:
                return await self._s3.get_object(Bucket=self._bucket, Key=attachment.object_key)
            except ClientError as exc:
                if not is_missing(exc):
                    raise
                return None

        task = asyncio.ensure_future(get())
        self._begun.append(task)
        return task

    async def _stored_file(self, response: Any, attachment: CarriedAttachment, path: str) -> AsyncIterator[bytes]:
        """The file's bytes from the bucket, in chunks. ``stream-zip`` checks them against the size and CRC-32 the
        local header already holds (what the upload measured) and fails the attempt when they differ; the manifest
        lists the SHA-256 the upload measured.
        """
        async for chunk in stored_chunks(response):
            yield chunk
        self._manifest.append({"name": path, "size_bytes": attachment.size_bytes, "sha256": attachment.sha256})
        # A fenced write after each file, as after each range of messages: a cancel or a lost lease is noticed
        # here, not once every file has gone in (docs/states.md: States and failure model).
        await self._after_each()

    async def _messages(self, after: int, last: int, after_each: Callable[[], Awaitable[None]]) -> AsyncIterator[bytes]:
        """The format's file, rendered range by range by a task that stays at most ``QUEUED_RANGES`` ahead."""
        rendered: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUED_RANGES)
        sink = _Sink(self, rendered)
        reading = asyncio.create_task(self._render(sink, after, last, after_each))
        self._begun.append(reading)
        digest, size = hashlib.sha256(), 0
        try:
            while (piece := await next_item(rendered, reading)) is not None:
                digest.update(piece)
                size += len(piece)
                yield piece
            self._messages_bound = size + size // 100 + 64 * 1024
            await reading
        finally:
            if not reading.done():
                reading.cancel()
                with contextlib.suppress(BaseException):
                    await reading
        self._manifest.append({"name": self.file_name, "size_bytes": size, "sha256": digest.hexdigest()})

    async def _render(self, sink: _Sink, after: int, last: int, after_each: Callable[[], Awaitable[None]]) -> None:
        await sink.put(sink.renderer.header())
        await self._reader.write(sink, after=after, last=last, after_each=after_each)
        await sink.put(sink.renderer.footer())
        await sink.queue.put(None)

    def shown(self, row: ExportRow) -> ExportRow:
        """``row`` as the ZIP's file shows it (``shared.export.media.with_media``), counted."""
        self.message_count += 1
        if self.first_seq is None:
            self.first_seq = row.seq
        self.last_seq = row.seq
        shown: ExportRow = with_media(row, self._plan, self._conversation_id)
        return shown


class _Sink:
    """What ``RangeReader.write`` hands its ranges to (as it hands them to a ``FileSet``): each range rendered and
    queued for the ZIP."""

    def __init__(self, owner: MediaZip, queue: asyncio.Queue[bytes | None]) -> None:
        self._owner = owner
        self.queue = queue
        self.renderer = owner._kind.renderer(owner._conversation_id)

    async def put(self, data: bytes) -> None:
        if data:
            await self.queue.put(data)

    async def add_rows(self, rows: list[ExportRow]) -> None:
        await self.put(b"".join(self.renderer.message(self._owner.shown(row)) for row in rows))

    async def add_lines(self, data: bytes) -> None:
        raise AssertionError("a ZIP's file is rendered row by row")  # FileKind.postgres_renders is False

    def progress(self) -> tuple[int, int]:
        return self._owner.progress()


async def next_item(queue: asyncio.Queue[T | None], producer: asyncio.Task[None]) -> T | None:
    """The next item of ``queue`` (None: the producer's end marker), or the error that ended ``producer`` before
    it put one."""
    getting = asyncio.ensure_future(queue.get())
    done, _ = await asyncio.wait({getting, producer}, return_when=asyncio.FIRST_COMPLETED)
    if getting not in done and producer.exception() is not None:
        getting.cancel()
        producer.result()  # raises what ended it
    # A producer that ended well put its end marker first.
    return await getting


def stored_method(size: int, end: int, *, force: bool = False) -> Any:
    """The stored member's method for a file of ``size`` bytes whose member ends at most ``end`` bytes into the ZIP:
    ZIP64 when either reaches the 32-bit fields' limit, or when ``force``d; given its size and CRC-32 it streams
    with both in its local header."""
    return NO_COMPRESSION_64 if force or size >= ZIP32_LIMIT or end >= ZIP32_LIMIT else NO_COMPRESSION_32


async def stored_chunks(response: Any) -> AsyncIterator[bytes]:
    """The bytes of a GET's ``response``, ``MEDIA_CHUNK_BYTES`` at a time."""
    async with response["Body"] as body:
        async for chunk in body.iter_chunks(MEDIA_CHUNK_BYTES):
            yield chunk


def manifest_bytes(members: list[dict[str, Any]], left_out: list[dict[str, Any]]) -> bytes:
    """``manifest.json``: every member before it (name, size, SHA-256) and every file left out, with why."""
    return json.dumps({"members": members, "left_out": left_out}, ensure_ascii=False, indent=1).encode() + b"\n"


def manifest_member(
    manifest: bytes, modified_at: datetime, *, end: int, force: bool = False
) -> tuple[str, datetime, int, Any, AsyncIterator[bytes]]:
    """The manifest as a stored member ending at most ``end`` bytes into the ZIP."""
    method = stored_method(len(manifest), end, force=force)
    return MANIFEST_NAME, modified_at, MEMBER_MODE, method(len(manifest), zlib.crc32(manifest)), _once(manifest)


def _close_unread(task: asyncio.Task[Any]) -> None:
    """Stop ``task`` (the messages' renderer, or a file's GET) if it still runs; a GET's response that came but
    was never read gives its connection back."""
    if not task.done():
        task.cancel()
    elif not task.cancelled() and task.exception() is None and isinstance(task.result(), dict):
        task.result()["Body"].close()


async def _nothing() -> None:
    return None


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data
