"""Assembling a chunked export's file from its finished chunks (docs/chunks.md: Chunked exports, Assembly).

The chunks' objects, in seq order, are the file. They become the parts of one multipart upload, chunk by
chunk as each finishes while later ones are still written, so that little is left to do after the last one.
Each chunk is read once, in ranges of which several are in flight: its bytes go into the file's sha256, must
have the sha256 its writer recorded, and give the MD5 of each part they make. A stretch of at least 5 MiB
starting a part is copied inside S3 (``UploadPartCopy``), and S3's ETag for the copy must be that MD5; S3
refuses, at completion, a part under 5 MiB that is not the last, so a shorter stretch (a chunk a filter mostly
left out, a compressed one, or the head of a chunk that completes a part in the making) is uploaded from the
bytes read, through a buffer sent as a part once it holds 5 MiB. The completed upload's ETag must be the one its
parts' MD5s make. The file's bytes are never read back: each part was checked as S3 stored it.

After each part that leaves nothing pending (no bytes read but not yet in a part, no copy in the making), the
assembly's ``Checkpoint`` is recorded: the upload, its parts, where the next byte comes from, and the states of
the file's and the current chunk's SHA-256. A coordinator that takes over resumes from it and reads only what
follows (docs/chunks.md: Chunked exports, A coordinator's takeover).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Self

from services.worker import metrics
from services.worker.chunked.sha256_state import ResumableSha256
from shared.export.formats import MIN_PART_BYTES
from shared.object_writer import StoredBytesDiffer, check_etag
from shared.repository.artifacts import ArtifactFiles
from shared.repository.chunks import Chunk
from shared.settings import WorkerPartSettings
from shared.storage import upload_deadline

# Each chunk is read in ranges of this size, this many at once (so at most 32 MiB held): against a store that
# limits each connection, the assembly must read faster than the chunks' writers write.
READ_RANGE_BYTES = 2 * 1024 * 1024
READS_IN_FLIGHT = 16
# The version of a recorded ``Checkpoint``'s JSON; a coordinator resumes only a version it knows.
CHECKPOINT_VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    """Where an assembly stands after a part, with nothing pending: its multipart ``upload_id``, its ``parts``
    (number, ETag, MD5 as hex), the ``size_bytes`` and ``messages`` they hold, the chunk the next byte comes
    from (``after_seq``, the chunk's first seq - 1, and its ``chunk_sha256``) at ``offset`` bytes into it, and
    the saved states (hex, ``ResumableSha256.state``) of the file's SHA-256 and of that chunk's first
    ``offset`` bytes.
    """

    upload_id: str
    parts: tuple[tuple[int, str, str], ...]
    size_bytes: int
    messages: int
    after_seq: int
    chunk_sha256: str | None
    offset: int
    file_state: str
    chunk_state: str

    def as_json(self) -> str:
        """The checkpoint as the artifact's ``assembly`` column holds it."""
        return json.dumps({"version": CHECKPOINT_VERSION, **asdict(self)})

    @classmethod
    def from_json(cls, text: str) -> Self | None:
        """The checkpoint ``as_json`` wrote; None for a version this release does not know."""
        fields = json.loads(text)
        if fields.pop("version", None) != CHECKPOINT_VERSION:
            return None
        fields["parts"] = tuple(tuple(part) for part in fields["parts"])
        return cls(**fields)


class Assembly:
    """Assembles ``key`` (stored with ``content_type``) in the bucket of ``settings``: ``start``, then ``add``
    each DONE chunk in seq order, then ``finish``. ``on_upload(upload_id)`` is awaited once the multipart
    upload exists, before its first part (to record it), and ``after_part()`` after each part (where the
    holder notices a cancel or a lost lease). ``on_checkpoint(checkpoint)``, when given, is awaited after each
    part that leaves nothing pending, before ``after_part``; ``resume`` takes up an assembly from one.
    """

    def __init__(
        self,
        s3: Any,
        settings: WorkerPartSettings,
        *,
        key: str,
        content_type: str,
        on_upload: Callable[[str], Awaitable[None]],
        after_part: Callable[[], Awaitable[None]],
        on_checkpoint: Callable[[Checkpoint], Awaitable[None]] | None = None,
    ) -> None:
        self._s3 = s3
        self._bucket = settings.s3_bucket
        self._timeout_seconds = settings.s3_timeout_seconds
        self._key = key
        self._content_type = content_type
        self._on_upload = on_upload
        self._after_part = after_part
        self._on_checkpoint = on_checkpoint
        self._upload_id = ""
        self._parts: list[dict[str, Any]] = []
        self._part_md5s: list[bytes] = []
        self._buffer = bytearray()
        self._whole = ResumableSha256()
        self._size = 0  # bytes of the chunks added whole
        self._messages = 0
        # The chunk being added, the bytes of it read, and its SHA-256 so far; None while a copy is in the
        # making, when no checkpoint may be taken.
        self._reading: tuple[Chunk, int, ResumableSha256] | None = None
        self._resume_at: Checkpoint | None = None

    async def start(self) -> None:
        """Begin the multipart upload and have it recorded."""
        created = await self._s3.create_multipart_upload(
            Bucket=self._bucket, Key=self._key, ContentType=self._content_type
        )
        self._upload_id = created["UploadId"]
        await self._on_upload(self._upload_id)

    def resume(self, checkpoint: Checkpoint) -> None:
        """Take up the assembly ``checkpoint`` recorded, instead of ``start``: then ``add`` every DONE chunk in
        seq order as before; those the checkpoint's parts hold are passed over unread.
        """
        self._upload_id = checkpoint.upload_id
        self._parts = [{"PartNumber": number, "ETag": etag} for number, etag, _ in checkpoint.parts]
        self._part_md5s = [bytes.fromhex(md5) for _, _, md5 in checkpoint.parts]
        self._whole = ResumableSha256(bytes.fromhex(checkpoint.file_state))
        self._size = checkpoint.size_bytes - checkpoint.offset
        self._messages = checkpoint.messages
        self._resume_at = checkpoint

    async def add(self, chunk: Chunk) -> None:
        """Add the DONE ``chunk`` after every chunk added before. Raises ``StoredBytesDiffer`` when its object
        is not what its writer recorded (or not the one a resumed checkpoint names) or S3 copied other bytes,
        and S3's errors.
        """
        assert chunk.object_key is not None and chunk.size_bytes is not None
        size = chunk.size_bytes
        piece, offset = ResumableSha256(), 0
        resume_at = self._resume_at
        if resume_at is not None:
            if chunk.after_seq < resume_at.after_seq:
                return  # in the checkpoint's parts already
            if chunk.after_seq > resume_at.after_seq or chunk.sha256 != resume_at.chunk_sha256:
                raise StoredBytesDiffer(f"chunk {chunk.chunk_no}: not the chunk the assembly's checkpoint names")
            piece, offset = ResumableSha256(bytes.fromhex(resume_at.chunk_state)), resume_at.offset
            self._resume_at = None
        start = offset
        # The head that completes a part in the making, then what starts a part of its own.
        head = min(size - start, MIN_PART_BYTES - len(self._buffer)) if self._buffer else 0
        copied = size - start - head >= MIN_PART_BYTES
        copy_md5 = hashlib.md5(usedforsecurity=False)
        async for data in self._read(chunk.object_key, start, size):
            piece.update(data)
            self._whole.update(data)
            view = memoryview(data)
            if offset < start + head:
                taken = view[: start + head - offset]
                self._buffer += taken
                view = view[len(taken) :]
            if copied:
                copy_md5.update(view)
            else:
                self._buffer += view
            offset += len(data)
            self._reading = None if copied else (chunk, offset, piece)
            if len(self._buffer) >= MIN_PART_BYTES:
                await self._flush()
        if piece.hexdigest() != chunk.sha256 or offset != size:
            raise StoredBytesDiffer(f"chunk {chunk.chunk_no}: its object is not what its writer recorded")
        if copied:
            # The copy leaves nothing pending: its checkpoint is the chunk's end.
            self._reading = (chunk, size, piece)
            await self._copy(chunk.object_key, start + head, size, copy_md5)
        self._size += size
        self._messages += chunk.message_count or 0
        self._reading = None

    async def finish(self) -> ArtifactFiles:
        """Upload the last part, complete the upload, check its ETag, and return the file."""
        if self._buffer or not self._parts:
            await self._flush()  # the last part may be small, and an empty file is one empty part
        completed = await self._s3.complete_multipart_upload(
            Bucket=self._bucket, Key=self._key, UploadId=self._upload_id, MultipartUpload={"Parts": self._parts}
        )
        whole = hashlib.md5(b"".join(self._part_md5s), usedforsecurity=False).hexdigest()
        check_etag(completed["ETag"], f"{whole}-{len(self._parts)}", what=self._key)
        return ArtifactFiles.one_file(
            self._key, size_bytes=self._size, sha256=self._whole.hexdigest(), message_count=self._messages
        )

    async def _copy(self, source: str, start: int, end: int, md5: Any) -> None:
        """Part: bytes ``start`` to ``end`` (exclusive) of ``source``, copied inside S3; ``md5`` is theirs."""
        number = len(self._parts) + 1
        copied = await self._s3.upload_part_copy(
            Bucket=self._bucket,
            Key=self._key,
            UploadId=self._upload_id,
            PartNumber=number,
            CopySource={"Bucket": self._bucket, "Key": source},
            CopySourceRange=f"bytes={start}-{end - 1}",
        )
        etag = copied["CopyPartResult"]["ETag"]
        check_etag(etag, md5.hexdigest(), what=f"part {number} of {self._key}")
        self._parts.append({"PartNumber": number, "ETag": etag})
        self._part_md5s.append(md5.digest())
        await self._part_added()

    async def _flush(self) -> None:
        """Part: the buffer's bytes, uploaded and checked against their MD5."""
        body = bytes(self._buffer)
        self._buffer.clear()
        number = len(self._parts) + 1
        md5 = hashlib.md5(body, usedforsecurity=False)
        async with upload_deadline(timeout_seconds=self._timeout_seconds, size_bytes=len(body)):
            uploaded = await self._s3.upload_part(
                Bucket=self._bucket, Key=self._key, UploadId=self._upload_id, PartNumber=number, Body=body
            )
        check_etag(uploaded["ETag"], md5.hexdigest(), what=f"part {number} of {self._key}")
        self._parts.append({"PartNumber": number, "ETag": uploaded["ETag"]})
        self._part_md5s.append(md5.digest())
        await self._part_added()

    async def _part_added(self) -> None:
        """Record the checkpoint the new part leaves when nothing is pending, then ``after_part``."""
        if self._on_checkpoint is not None and not self._buffer and self._reading is not None:
            chunk, offset, piece = self._reading
            await self._on_checkpoint(self._checkpoint(chunk, offset, piece))
        await self._after_part()

    def _checkpoint(self, chunk: Chunk, offset: int, piece: ResumableSha256) -> Checkpoint:
        """The checkpoint of parts that hold every chunk before ``chunk`` and its first ``offset`` bytes
        (``piece`` their SHA-256).
        """
        return Checkpoint(
            upload_id=self._upload_id,
            parts=tuple(
                (part["PartNumber"], part["ETag"], md5.hex())
                for part, md5 in zip(self._parts, self._part_md5s, strict=True)
            ),
            size_bytes=self._size + offset,
            messages=self._messages,
            after_seq=chunk.after_seq,
            chunk_sha256=chunk.sha256,
            offset=offset,
            file_state=self._whole.state().hex(),
            chunk_state=piece.state().hex(),
        )

    async def _read(self, key: str, offset: int, size: int) -> AsyncIterator[bytes]:
        """Bytes ``offset`` to ``size`` of ``key`` in order, read as ranges of ``READ_RANGE_BYTES`` of which
        ``READS_IN_FLIGHT`` are in flight at once: one connection to a slow S3 would make the assembly as
        slow as one chunk's writer. At most that many ranges are held.
        """
        starts = iter(range(offset, size, READ_RANGE_BYTES))
        window: collections.deque[asyncio.Task[bytes]] = collections.deque()

        def more() -> None:
            start = next(starts, None)
            if start is not None:
                window.append(asyncio.create_task(self._range(key, start, min(start + READ_RANGE_BYTES, size))))

        for _ in range(READS_IN_FLIGHT):
            more()
        try:
            while window:
                data = await window.popleft()
                more()
                yield data
        finally:
            for task in window:
                task.cancel()
            await asyncio.gather(*window, return_exceptions=True)

    async def _range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of ``key``."""
        response = await self._s3.get_object(Bucket=self._bucket, Key=key, Range=f"bytes={start}-{end - 1}")
        async with response["Body"] as stream:
            data: bytes = await stream.read()
        if len(data) != end - start:
            raise StoredBytesDiffer(f"{key}: read {len(data)} bytes of {end - start}")
        metrics.ASSEMBLY_BYTES_READ.inc(len(data))
        return data
