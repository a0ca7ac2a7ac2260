"""Writing one artifact object to S3 with bounded memory, checked against what S3 says it stored.

Bytes are buffered up to one part (``s3_part_size_bytes``); a file that outgrows one part becomes a
multipart upload, a smaller one a single PutObject. A full part uploads in the background while the next
one fills, so reading from Postgres and writing to S3 overlap; at most one upload is in flight, so the
writer holds about two parts whatever the export's size (the export adds the range it has just read).
What is written is kept as the caller's own objects until a part is cut from them, so each byte is copied
once on its way to S3, and not at all when one write is exactly a part (docs/benchmark.md: The read of an
export's lines).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import logging
from dataclasses import dataclass
from typing import Any

from shared.settings import StorageSettings
from shared.storage import upload_deadline

log = logging.getLogger(__name__)

READBACK_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Digest:
    """What a file holds: ``size_bytes`` and hex ``sha256`` of its stored bytes. The messages in it are counted
    by whoever renders them (``services.worker.writing.files``); equal bytes hold equal counts.
    """

    size_bytes: int
    sha256: str


class ObjectWriter:
    """Streams bytes into ``bucket/key``, stored with ``content_type``. It calls nothing but S3: what the
    caller records (the multipart upload it began, the digest of what it stored) it reads from the writer.

    Each upload request is bounded by ``shared.storage.upload_deadline`` from ``timeout_seconds``.
    """

    def __init__(
        self,
        s3: Any,
        *,
        bucket: str,
        key: str,
        part_size: int,
        timeout_seconds: float,
        content_type: str,
    ) -> None:
        self._s3 = s3
        self._timeout_seconds = timeout_seconds
        self._bucket = bucket
        self._key = key
        self._part_size = part_size
        self._content_type = content_type
        # What was written and is not yet in a part: the caller's bytes, or views of their tail.
        self._pending: list[memoryview] = []
        self._pending_size = 0
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._in_flight: asyncio.Task[None] | None = None
        self._part_md5s: dict[int, bytes] = {}
        self._hash = hashlib.sha256()
        self._size = 0

    @classmethod
    def in_bucket(cls, s3: Any, settings: StorageSettings, *, key: str, content_type: str) -> ObjectWriter:
        """A writer of ``key`` in the bucket of ``settings``, in its part size and with its timeout."""
        return cls(
            s3,
            bucket=settings.s3_bucket,
            key=key,
            part_size=settings.s3_part_size_bytes,
            timeout_seconds=settings.s3_timeout_seconds,
            content_type=content_type,
        )

    @property
    def upload_id(self) -> str | None:
        """The multipart upload this writer began, or None while the object is still a single PutObject."""
        return self._upload_id

    def digest(self) -> Digest:
        """Size and sha256 of everything written so far."""
        return Digest(self._size, self._hash.hexdigest())

    async def write(self, data: bytes) -> None:
        """Append ``data``; starts a part's upload whenever a full one is buffered. ``data`` is kept, not
        copied, until it is in a part: the caller must not change it (``bytes`` never change).
        """
        self._hash.update(data)
        self._size += len(data)
        rest = memoryview(data)
        while self._pending_size + len(rest) >= self._part_size:
            room = self._part_size - self._pending_size
            self._pending.append(rest[:room])
            self._pending_size += room
            rest = rest[room:]
            await self._start_part()
        if rest:
            self._pending.append(rest)
            self._pending_size += len(rest)

    def _take_pending(self) -> bytes:
        """Everything pending, as one ``bytes``: the caller's own object when it is one whole write."""
        pieces, self._pending, self._pending_size = self._pending, [], 0
        if len(pieces) == 1 and isinstance(pieces[0].obj, bytes) and pieces[0].nbytes == len(pieces[0].obj):
            return pieces[0].obj
        return b"".join(pieces)

    async def _start_part(self) -> None:
        # Waiting for the previous part first bounds memory and surfaces its error here; joining the pending
        # pieces only after it has gone keeps the part in flight and the part being joined from being held at
        # once (docs/benchmark.md: The part joined after the one in flight).
        await self._wait_in_flight()
        chunk = self._take_pending()
        if self._upload_id is None:
            created = await self._s3.create_multipart_upload(
                Bucket=self._bucket, Key=self._key, ContentType=self._content_type
            )
            self._upload_id = created["UploadId"]
        part = {"PartNumber": len(self._parts) + 1}
        self._parts.append(part)
        self._in_flight = asyncio.create_task(self._upload_part(part, chunk))

    async def _upload_part(self, part: dict[str, Any], chunk: bytes) -> None:
        md5 = hashlib.md5(chunk, usedforsecurity=False)
        size = len(chunk)
        # botocore hands a body of bytes to aiohttp as a BytesIO over them, and aiohttp copies the buffer of a
        # BytesIO that shares its bytes with anybody else: one the writer made from a part it joined, and holds
        # no more, is sent as it is, so a part in flight is held once.
        body = io.BytesIO(chunk)
        del chunk
        async with upload_deadline(timeout_seconds=self._timeout_seconds, size_bytes=size):
            uploaded = await self._s3.upload_part(
                Bucket=self._bucket, Key=self._key, UploadId=self._upload_id, PartNumber=part["PartNumber"], Body=body
            )
        check_etag(uploaded["ETag"], md5.hexdigest(), what=f"part {part['PartNumber']} of {self._key}")
        part["ETag"] = uploaded["ETag"]
        self._part_md5s[part["PartNumber"]] = md5.digest()

    async def _wait_in_flight(self) -> None:
        if self._in_flight is not None:
            task, self._in_flight = self._in_flight, None
            await task

    async def finish(self) -> Digest:
        """Upload what is buffered and make the object visible; return its digest once S3 has shown that it
        stored exactly these bytes.

        S3 computes the ETag of a PutObject, and of each part of a multipart upload, as the MD5 of the bytes
        it received (no SSE-KMS here), and the ETag of the completed upload from the parts' MD5s; each is
        compared with the MD5 this writer computed of what it sent, so a byte changed on the way fails the
        export (``StoredBytesDiffer``) without reading the object back. Size, sha256 and the messages counted
        as they were rendered are then those of the bytes S3 holds (docs/states.md: States and failure model). The
        client's own checksums cannot serve: some S3 implementations (moto among them) echo them without
        checking.
        """
        if self._upload_id is None:
            rest = self._take_pending()
            md5 = hashlib.md5(rest, usedforsecurity=False).hexdigest()
            async with upload_deadline(timeout_seconds=self._timeout_seconds, size_bytes=len(rest)):
                stored = await self._s3.put_object(
                    Bucket=self._bucket, Key=self._key, Body=rest, ContentType=self._content_type
                )
            check_etag(stored["ETag"], md5, what=self._key)
            return self.digest()
        if self._pending:
            # Not held here while it uploads, as no other part is (``_upload_part``).
            await self._start_part()
        await self._wait_in_flight()
        completed = await self._s3.complete_multipart_upload(
            Bucket=self._bucket, Key=self._key, UploadId=self._upload_id, MultipartUpload={"Parts": self._parts}
        )
        whole = hashlib.md5(b"".join(self._part_md5s[n] for n in sorted(self._part_md5s)), usedforsecurity=False)
        check_etag(completed["ETag"], f"{whole.hexdigest()}-{len(self._part_md5s)}", what=self._key)
        return self.digest()

    async def abandon(self) -> None:
        """Stop the part upload in flight and drop the buffer; removing what S3 holds is the caller's job
        (``shared.artifact_removal.remove_artifact``), under the artifact's record.
        """
        self._pending, self._pending_size = [], 0
        if self._in_flight is not None:
            self._in_flight.cancel()
            with contextlib.suppress(BaseException):
                await self._in_flight
            self._in_flight = None


class StoredBytesDiffer(Exception):
    """S3's ETag for an upload is not the MD5 of the bytes sent: they were changed on the way."""


def check_etag(etag: str, expected: str, *, what: str) -> None:
    """Raise ``StoredBytesDiffer`` unless S3's ``etag`` for ``what`` is the hex MD5 ``expected``."""
    if etag.strip('"') != expected:
        raise StoredBytesDiffer(f"{what}: S3 stored other bytes than were sent (ETag {etag}, sent MD5 {expected})")


async def read_digest(s3: Any, *, bucket: str, key: str) -> Digest:
    """Read ``bucket/key`` back in chunks and measure it, to verify what S3 actually holds."""
    digest = hashlib.sha256()
    size = 0
    response = await s3.get_object(Bucket=bucket, Key=key)
    async with response["Body"] as stream:
        async for chunk in stream.iter_chunks(READBACK_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return Digest(size, digest.hexdigest())
