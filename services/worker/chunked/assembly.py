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
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from shared.export.formats import MIN_PART_BYTES
from shared.object_writer import StoredBytesDiffer, check_etag
from shared.repository.artifacts import ArtifactFiles
from shared.repository.chunks import Chunk
from shared.settings import WorkerPartSettings
from shared.storage import upload_deadline

# Each chunk is read in ranges of this size, this many at once (so at most 32 MiB held): against a store that
# limits each connection, the assembly must read faster than the chunks' writers write.
READ_RANGE_BYTES = 4 * 1024 * 1024
READS_IN_FLIGHT = 8


class Assembly:
    """Assembles ``key`` (stored with ``content_type``) in the bucket of ``settings``: ``start``, then ``add``
    each DONE chunk in seq order, then ``finish``. ``on_upload(upload_id)`` is awaited once the multipart
    upload exists, before its first part (to record it), and ``after_part()`` after each part (where the
    holder notices a cancel or a lost lease).
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
        self._part_md5s: list[bytes] = []
        self._buffer = bytearray()
        self._whole = hashlib.sha256()
        self._size = 0
        self._messages = 0

    async def start(self) -> None:
        """Begin the multipart upload and have it recorded."""
        created = await self._s3.create_multipart_upload(
            Bucket=self._bucket, Key=self._key, ContentType=self._content_type
        )
        self._upload_id = created["UploadId"]
        await self._on_upload(self._upload_id)

    async def add(self, chunk: Chunk) -> None:
        """Add the DONE ``chunk`` after every chunk added before. Raises ``StoredBytesDiffer`` when its object
        is not what its writer recorded or S3 copied other bytes, and S3's errors.
        """
        assert chunk.object_key is not None and chunk.size_bytes is not None
        size = chunk.size_bytes
        # The head that completes a part in the making, then what starts a part of its own.
        head = min(size, MIN_PART_BYTES - len(self._buffer)) if self._buffer else 0
        copied = size - head >= MIN_PART_BYTES
        piece, copy_md5, offset = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
        async for data in self._read(chunk.object_key, size):
            piece.update(data)
            self._whole.update(data)
            view = memoryview(data)
            if offset < head:
                taken = view[: head - offset]
                self._buffer += taken
                view = view[len(taken) :]
            if copied:
                copy_md5.update(view)
            else:
                self._buffer += view
            offset += len(data)
            if len(self._buffer) >= MIN_PART_BYTES:
                await self._flush()
        if piece.hexdigest() != chunk.sha256 or offset != size:
            raise StoredBytesDiffer(f"chunk {chunk.chunk_no}: its object is not what its writer recorded")
        if copied:
            await self._copy(chunk.object_key, head, size, copy_md5)
        self._size += size
        self._messages += chunk.message_count or 0

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
        await self._after_part()

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
        await self._after_part()

    async def _read(self, key: str, size: int) -> AsyncIterator[bytes]:
        """The ``size`` bytes of ``key`` in order, read as ranges of ``READ_RANGE_BYTES`` of which
        ``READS_IN_FLIGHT`` are in flight at once: one connection to a slow S3 would make the assembly as
        slow as one chunk's writer. At most that many ranges are held.
        """
        starts = iter(range(0, size, READ_RANGE_BYTES))
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
        return data
