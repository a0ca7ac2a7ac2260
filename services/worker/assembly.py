"""Assembling a chunked export's file from its finished chunks (docs/chunks.md: Chunked exports, Assembly).

The chunks' objects, in seq order, are the file. They become the parts of one multipart upload without their
bytes passing through the worker: ``UploadPartCopy`` of each chunk, or of the rest of it. S3 refuses, at
completion, a part under 5 MiB that is not the last, so a chunk smaller than that (a range a filter mostly
left out, a compressed one) is read through the assembler into a part in the making, together with the
head of the next chunk when that is needed to reach 5 MiB: the buffer never holds more than 5 MiB.

The assembled object is then read once, in ranges of which several are in flight: its sha256 and size are
the file's, and each chunk's stretch of it must have the sha256 its writer recorded, so a part copied
wrongly fails the export (a transient error: the next attempt assembles again).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from services.worker.object_writer import StoredBytesDiffer, check_etag
from shared.formats import MIN_PART_BYTES
from shared.repository.artifacts import ArtifactFiles
from shared.repository.chunks import Chunk
from shared.settings import Settings
from shared.storage import upload_deadline

# The verifying read: ranges of this size, this many at once (so at most 32 MiB held).
VERIFY_RANGE_BYTES = 8 * 1024 * 1024
VERIFY_READS = 4


class Assembly:
    """Assembles ``key`` (stored with ``content_type``) in the bucket of ``settings``; ``on_upload(upload_id)``
    is awaited once the multipart upload exists, before its first part (to record it), and ``after_part()``
    after each part (where the holder notices a cancel or a lost lease).
    """

    def __init__(
        self,
        s3: Any,
        settings: Settings,
        *,
        key: str,
        content_type: str,
        on_upload: Callable[[str], Awaitable[None]],
        after_part: Callable[[], Awaitable[None]],
    ) -> None:
        self._s3 = s3
        self._bucket = settings.s3_bucket
        self._timeout_seconds = settings.s3_timeout_seconds
        self._key = key
        self._content_type = content_type
        self._on_upload = on_upload
        self._after_part = after_part
        self._upload_id = ""
        self._parts: list[dict[str, Any]] = []
        self._buffer = bytearray()

    async def run(self, done: Sequence[Chunk]) -> ArtifactFiles:
        """Assemble the DONE chunks ``done`` (in seq order), verify the file and return it as one file.
        Raises ``StoredBytesDiffer`` when the stored bytes are not the chunks', and S3's errors.
        """
        created = await self._s3.create_multipart_upload(
            Bucket=self._bucket, Key=self._key, ContentType=self._content_type
        )
        self._upload_id = created["UploadId"]
        await self._on_upload(self._upload_id)
        for chunk in done:
            await self._add(chunk)
        if self._buffer or not self._parts:
            await self._flush()  # the last part may be small, and an empty file is one empty part
        await self._s3.complete_multipart_upload(
            Bucket=self._bucket, Key=self._key, UploadId=self._upload_id, MultipartUpload={"Parts": self._parts}
        )
        size, sha256 = await self._verify(done)
        count = sum(chunk.message_count or 0 for chunk in done)
        return ArtifactFiles.one_file(self._key, size_bytes=size, sha256=sha256, message_count=count)

    async def _add(self, chunk: Chunk) -> None:
        """Add ``chunk``'s bytes after what came before: copied by S3 where a stretch of at least 5 MiB starts
        a part, else through the buffer.
        """
        assert chunk.object_key is not None and chunk.size_bytes is not None
        size, offset = chunk.size_bytes, 0
        if self._buffer:
            offset = min(size, MIN_PART_BYTES - len(self._buffer))
            self._buffer += await self._read(chunk.object_key, 0, offset)
            if len(self._buffer) >= MIN_PART_BYTES:
                await self._flush()
        rest = size - offset
        if rest >= MIN_PART_BYTES:
            await self._copy(chunk.object_key, offset, size)
        elif rest > 0:
            self._buffer += await self._read(chunk.object_key, offset, size)

    async def _copy(self, source: str, start: int, end: int) -> None:
        """Part: bytes ``start`` to ``end`` (exclusive) of ``source``, copied inside S3."""
        copied = await self._s3.upload_part_copy(
            Bucket=self._bucket,
            Key=self._key,
            UploadId=self._upload_id,
            PartNumber=len(self._parts) + 1,
            CopySource={"Bucket": self._bucket, "Key": source},
            CopySourceRange=f"bytes={start}-{end - 1}",
        )
        self._parts.append({"PartNumber": len(self._parts) + 1, "ETag": copied["CopyPartResult"]["ETag"]})
        await self._after_part()

    async def _flush(self) -> None:
        """Part: the buffer's bytes, uploaded and checked against their MD5."""
        body = bytes(self._buffer)
        self._buffer.clear()
        number = len(self._parts) + 1
        async with upload_deadline(timeout_seconds=self._timeout_seconds, size_bytes=len(body)):
            uploaded = await self._s3.upload_part(
                Bucket=self._bucket, Key=self._key, UploadId=self._upload_id, PartNumber=number, Body=body
            )
        check_etag(
            uploaded["ETag"], hashlib.md5(body, usedforsecurity=False).hexdigest(), what=f"part {number} of {self._key}"
        )
        self._parts.append({"PartNumber": number, "ETag": uploaded["ETag"]})
        await self._after_part()

    async def _read(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of ``key``; nothing for an empty stretch."""
        if end <= start:
            return b""
        response = await self._s3.get_object(Bucket=self._bucket, Key=key, Range=f"bytes={start}-{end - 1}")
        async with response["Body"] as stream:
            data: bytes = await stream.read()
        if len(data) != end - start:
            raise StoredBytesDiffer(f"{key}: read {len(data)} bytes of {end - start}")
        return data

    async def _verify(self, done: Sequence[Chunk]) -> tuple[int, str]:
        """Read the assembled object once: (its size, its hex sha256), after checking that it has the size of
        its chunks and that each chunk's stretch of it has that chunk's recorded sha256.
        """
        expected_size = sum(chunk.size_bytes or 0 for chunk in done)
        head = await self._s3.head_object(Bucket=self._bucket, Key=self._key)
        if head["ContentLength"] != expected_size:
            raise StoredBytesDiffer(f"{self._key}: {head['ContentLength']} bytes, its chunks hold {expected_size}")
        whole = hashlib.sha256()
        chunks = iter(done)
        current, piece, left = _next(chunks)
        async for data in self._ranges(expected_size):
            whole.update(data)
            view = memoryview(data)
            while view:
                while current is not None and left == 0:  # chunks of no bytes
                    _check_chunk(current, piece)
                    current, piece, left = _next(chunks)
                assert current is not None  # the sizes add up
                taken, view = view[:left], view[left:]
                piece.update(taken)
                left -= len(taken)
        while current is not None:
            _check_chunk(current, piece)
            current, piece, left = _next(chunks)
        return expected_size, whole.hexdigest()

    async def _ranges(self, size: int) -> AsyncIterator[bytes]:
        """The assembled object's ``size`` bytes in order, read as ranges of ``VERIFY_RANGE_BYTES`` of which
        ``VERIFY_READS`` are in flight at once: one connection to a slow S3 would make the read as long as
        the whole export's writing. At most that many ranges are held.
        """
        starts = iter(range(0, size, VERIFY_RANGE_BYTES))
        window: collections.deque[asyncio.Task[bytes]] = collections.deque()

        def more() -> None:
            start = next(starts, None)
            if start is not None:
                window.append(asyncio.create_task(self._read(self._key, start, min(start + VERIFY_RANGE_BYTES, size))))

        for _ in range(VERIFY_READS):
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


def _next(chunks: Any) -> tuple[Chunk | None, Any, int]:
    chunk = next(chunks, None)
    return chunk, hashlib.sha256(), 0 if chunk is None else (chunk.size_bytes or 0)


def _check_chunk(chunk: Chunk, piece: Any) -> None:
    if piece.hexdigest() != chunk.sha256:
        raise StoredBytesDiffer(f"chunk {chunk.chunk_no}: the assembled bytes differ from what its writer stored")
