"""Writing a split export with media: parts under the artifact's folder, each a self-contained ZIP of at most
``max_part_bytes`` (docs/api.md: Submitting an export, Exports with media): the format's file of the messages in
the part, the files those messages carry (a file carried in two parts is in both), and its manifest.

A part's size is bounded before its bytes are written: the messages' file by its rendered size (deflate adds at
most a little to it), each file by its recorded size, every header, the central directory and the manifest by
their largest size; a message that would take the part past the limit starts the next one. The files' order in
a part follows its messages, so the ZIP writes the messages' file first: a file the bucket no longer holds is
found before, by a HEAD of every file, and listed ``unavailable``.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError
from stream_zip import ZIP_64, async_stream_zip

from services.worker.writing.media_zip import (
    MEMBER_MODE,
    QUEUED_RANGES,
    ZIP_CHUNK_BYTES,
    MessageReader,
    ZipWriter,
    manifest_bytes,
    manifest_member,
    next_item,
    stored_chunks,
    stored_method,
)
from shared.export.formats import FileKind
from shared.export.media import TOO_LARGE, MediaPlan, left_out_entries, safe_name, with_media
from shared.export.rendering import Renderer, attachments_of
from shared.repository.artifacts import StoredPart
from shared.repository.export_reader import CarriedAttachment, ExportRow
from shared.storage import is_missing, part_key

# The most a member adds besides its name and data: its local header with the ZIP64 and timestamp extra fields,
# a data descriptor, and its central directory entry with the same extras.
MEMBER_OVERHEAD = 256
# The end of a ZIP: the ZIP64 end record and locator, and the classic end record.
ZIP_END = 128
# The most the manifest takes besides one entry per member: its brackets, its left-out list's and its header.
MANIFEST_BASE = 1024
# Deflate never makes data much bigger (zlib's bound is a few bytes per 16 KiB and a few more per stream).
DEFLATE_SLACK = 4096
# HEADs of the files in flight at once, before the first part.
HEADS_AT_ONCE = 16
# A file bigger than the part size less this is too large for any part (docs/api.md: Submitting an export,
# Exports with media).
PART_RESERVE = 1024 * 1024


def deflated_at_most(size: int) -> int:
    """The most ``size`` bytes take deflated."""
    return size + size // 1000 + DEFLATE_SLACK


def member_cost(name: str, size: int) -> int:
    """The most a stored member of ``size`` bytes named ``name`` takes in a ZIP, manifest entry included."""
    return MEMBER_OVERHEAD + 3 * len(name.encode()) + 160 + size


@dataclass
class _Part:
    """One part being filled: its messages, the files they carry (id -> member path, in order) and its bound."""

    budget: int
    used: int = 0
    messages: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    files: dict[str, str] = field(default_factory=dict)
    # Every file its messages carry, in or out, and the manifest's entries.
    seen: dict[str, None] = field(default_factory=dict)
    manifest: list[dict[str, Any]] = field(default_factory=list)


class MediaZipParts:
    """Writes the parts, ZIPs of at most ``max_part_bytes``, of ``kind``'s file of ``conversation_id`` (read by
    ``reader``) with the media of ``plan`` (``carried``, the attachments in the order the plan saw them) under
    the folder ``folder`` of ``bucket``, each through a writer of ``writer_for(key)``. ``modified_at`` dates the
    files and manifests.
    """

    def __init__(
        self,
        *,
        s3: Any,
        bucket: str,
        folder: str,
        kind: FileKind,
        conversation_id: str,
        reader: MessageReader,
        writer_for: Callable[[str], ZipWriter],
        plan: MediaPlan,
        carried: list[CarriedAttachment],
        modified_at: datetime,
        max_part_bytes: int,
    ) -> None:
        self._s3 = s3
        self._bucket = bucket
        self._folder = folder
        self._kind = kind
        self._conversation_id = conversation_id
        self._reader = reader
        self._writer_for = writer_for
        self._plan = plan
        self._by_id = {attachment.attachment_id: attachment for attachment in carried}
        self._modified_at = modified_at
        self._max_part_bytes = max_part_bytes
        self._rows: asyncio.Queue[list[ExportRow] | None] = asyncio.Queue(QUEUED_RANGES)
        self._waiting: list[ExportRow] = []
        self._ended = False
        self._writers: list[ZipWriter] = []
        self.message_count = 0

    @property
    def file_name(self) -> str:
        """The format's file in each part: the conversation's id made safe, with the format's extension."""
        return f"{safe_name(self._conversation_id)}.{self._kind.format}"

    def progress(self) -> tuple[int, int]:
        """(messages put in parts, bytes stored) so far."""
        return self.message_count, sum(writer.digest().size_bytes for writer in self._writers)

    async def write(self, *, after: int, last: int, after_each: Callable[[], Awaitable[None]]) -> list[StoredPart]:
        """Write the parts of the messages of seqs ``after < seq <= last`` and their media, awaiting
        ``after_each()`` after each range of messages and each part; return them as verified. Raises the storage's
        and the database's errors, and ``stream-zip``'s when a file is not the one its upload measured.
        """
        await self._find_unavailable()
        reading = asyncio.create_task(self._read(after, last, after_each))
        parts: list[StoredPart] = []
        try:
            while not parts or not await self._exhausted(reading):
                parts.append(await self._write_part(len(parts) + 1, reading))
                await after_each()
            await reading
        finally:
            if not reading.done():
                reading.cancel()
        return parts

    async def _find_unavailable(self) -> None:
        """HEAD every file the plan includes; one the bucket no longer holds is ``unavailable``."""
        gate = asyncio.Semaphore(HEADS_AT_ONCE)

        async def check(attachment: CarriedAttachment) -> None:
            async with gate:
                try:
                    await self._s3.head_object(Bucket=self._bucket, Key=attachment.object_key)
                except ClientError as exc:
                    if not is_missing(exc):
                        raise
                    self._plan.mark_unavailable(attachment.attachment_id, attachment.size_bytes)

        included = [self._by_id[attachment_id] for attachment_id in list(self._plan.included)]
        await asyncio.gather(*(check(attachment) for attachment in included))

    async def _read(self, after: int, last: int, after_each: Callable[[], Awaitable[None]]) -> None:
        await self._reader.write(_RowSink(self), after=after, last=last, after_each=after_each)
        await self._rows.put(None)

    async def _exhausted(self, reading: asyncio.Task[None]) -> bool:
        """True when no message is left for another part."""
        return await self._peek(reading) is None

    async def _peek(self, reading: asyncio.Task[None]) -> ExportRow | None:
        while not self._waiting and not self._ended:
            batch = await next_item(self._rows, reading)
            if batch is None:
                self._ended = True
            else:
                self._waiting.extend(batch)
        return self._waiting[0] if self._waiting else None

    async def _write_part(self, number: int, reading: asyncio.Task[None]) -> StoredPart:
        key = part_key(self._folder, number, extension=self._kind.extension)
        writer = self._writer_for(key)
        self._writers.append(writer)
        renderer = self._kind.renderer(self._conversation_id)
        fixed = (
            ZIP_END
            + MANIFEST_BASE
            + MEMBER_OVERHEAD
            + 3 * len(self.file_name.encode())
            + deflated_at_most(len(renderer.header()) + renderer.footer_at_most)
        )
        part = _Part(budget=self._max_part_bytes - fixed)
        messages = _Messages(self, part, renderer, reading)
        async for chunk in async_stream_zip(self._members(part, messages), chunk_size=ZIP_CHUNK_BYTES):
            await writer.write(chunk)
        stored = await writer.finish()
        return StoredPart(number, key, stored.size_bytes, stored.sha256, part.messages, part.first_seq, part.last_seq)

    async def _members(
        self, part: _Part, messages: _Messages
    ) -> AsyncIterator[tuple[str, datetime, int, Any, AsyncIterator[bytes]]]:
        yield self.file_name, self._modified_at, MEMBER_MODE, ZIP_64, messages.chunks()
        # The part's files are known once its messages are: their order follows them.
        offset = part.used
        for attachment_id, path in part.files.items():
            attachment = self._by_id[attachment_id]
            size = attachment.size_bytes
            offset += member_cost(path, size)
            method = stored_method(size, offset)
            response = await self._s3.get_object(Bucket=self._bucket, Key=attachment.object_key)
            part.manifest.append({"name": path, "size_bytes": size, "sha256": attachment.sha256})
            yield path, attachment.created_at, MEMBER_MODE, method(size, attachment.crc32), stored_chunks(response)
        left_out = left_out_entries(self._plan, (self._by_id[attachment_id] for attachment_id in part.seen))
        manifest = manifest_bytes(part.manifest, left_out)
        yield manifest_member(manifest, self._modified_at, end=offset + MEMBER_OVERHEAD + len(manifest))

    def admit(self, part: _Part, renderer: Renderer, row: ExportRow) -> tuple[Renderer, bytes] | None:
        """``row`` rendered into ``part`` (the renderer to go on with, and its bytes), or None when it does not fit
        and the part holds messages already. In an empty part, a message whose files do not all fit leaves out the
        last of them as ``too_large`` until it does.
        """
        while True:
            new = [
                (item["attachment_id"], self._plan.included[item["attachment_id"]])
                for item in attachments_of(row)
                if item["attachment_id"] in self._plan.included and item["attachment_id"] not in part.files
            ]
            trial = copy.copy(renderer)
            piece = trial.message(with_media(row, self._plan, self._conversation_id))
            cost = (
                deflated_at_most(len(piece))
                - DEFLATE_SLACK
                + sum(member_cost(path, self._by_id[attachment_id].size_bytes) for attachment_id, path in new)
            )
            if part.used + cost <= part.budget:
                break
            if part.messages or not new:
                # A message alone over a part's bound cannot be (the body limits are far below the 5 MiB floor).
                return None if part.messages else self._take(part, new, row, trial, piece, cost)
            attachment_id = new[-1][0]
            self._plan.left_out[attachment_id] = TOO_LARGE
            self._plan.included_bytes -= self._by_id[attachment_id].size_bytes
            del self._plan.included[attachment_id]
        return self._take(part, new, row, trial, piece, cost)

    def _take(
        self, part: _Part, new: list[tuple[str, str]], row: ExportRow, trial: Renderer, piece: bytes, cost: int
    ) -> tuple[Renderer, bytes]:
        part.used += cost
        part.files.update(new)
        part.seen.update((item["attachment_id"], None) for item in attachments_of(row))
        part.messages += 1
        part.first_seq = row.seq if part.first_seq is None else part.first_seq
        part.last_seq = row.seq
        self.message_count += 1
        return trial, piece


class _Messages:
    """The format's file of one part: rows taken while they fit."""

    def __init__(self, owner: MediaZipParts, part: _Part, renderer: Renderer, reading: asyncio.Task[None]) -> None:
        self._owner = owner
        self._part = part
        self._renderer = renderer
        self._reading = reading

    async def chunks(self) -> AsyncIterator[bytes]:
        owner, part = self._owner, self._part
        digest, size = hashlib.sha256(), 0
        header = self._renderer.header()
        digest.update(header)
        size += len(header)
        yield header
        while (row := await owner._peek(self._reading)) is not None:
            admitted = owner.admit(part, self._renderer, row)
            if admitted is None:
                break
            owner._waiting.pop(0)
            self._renderer, piece = admitted
            digest.update(piece)
            size += len(piece)
            yield piece
        footer = self._renderer.footer()
        digest.update(footer)
        size += len(footer)
        yield footer
        part.manifest.append({"name": owner.file_name, "size_bytes": size, "sha256": digest.hexdigest()})


class _RowSink:
    """What ``RangeReader.write`` hands its ranges to: each range's rows queued for the parts."""

    def __init__(self, owner: MediaZipParts) -> None:
        self._owner = owner

    async def add_rows(self, rows: list[ExportRow]) -> None:
        await self._owner._rows.put(rows)

    async def add_lines(self, data: bytes) -> None:
        raise AssertionError("a ZIP's file is rendered row by row")  # FileKind.postgres_renders is False

    def progress(self) -> tuple[int, int]:
        return self._owner.progress()
