"""The ZIP writer of exports with media (``services.worker.writing.media_zip``; docs/api.md: Submitting an export,
Exports with media): a stored member's local header holds its size and CRC-32, ZIP64 where the
size needs it (a 5 GB file, streamed into a hashing sink in bounded memory) or where it is forced (small files,
through the S3 emulator), and never a data descriptor.
"""

from __future__ import annotations

import hashlib
import io
import struct
import subprocess
import zipfile
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from services.worker.writing.media_zip import MediaZip
from services.worker.writing.ranges import Files, RangeReader
from services.worker.writing.read_source import ReadSource
from shared.export.formats import FileKind
from shared.export.media import plan_media
from shared.export.request import ExportRequest
from shared.object_writer import Digest, ObjectWriter
from shared.repository import export_reader
from shared.repository.export_reader import CarriedAttachment
from shared.settings import Settings
from tests.support.api_calls import make_conversation
from tests.support.messages import Auth, Client, send_with, uploaded

FIVE_GB = 5 * 10**9
BLOCK = bytes(range(256)) * 4096  # 1 MiB
ZIP64_EXTRA = 0x0001
WHEN = datetime(2026, 12, 6, tzinfo=UTC)


def local_header(content: bytes, at: int) -> dict[str, Any]:
    """The local file header at ``at``: its fields and its extra fields by id."""
    assert content[at : at + 4] == b"PK\x03\x04"
    version, flags, method, _time, _date, crc32, compressed, size, name_length, extra_length = struct.unpack(
        "<HHHHHIIIHH", content[at + 4 : at + 30]
    )
    name = content[at + 30 : at + 30 + name_length].decode()
    raw = content[at + 30 + name_length : at + 30 + name_length + extra_length]
    extras, offset = {}, 0
    while offset < len(raw):
        header_id, length = struct.unpack("<HH", raw[offset : offset + 4])
        extras[header_id] = raw[offset + 4 : offset + 4 + length]
        offset += 4 + length
    return {
        "version": version,
        "flags": flags,
        "method": method,
        "crc32": crc32,
        "compressed": compressed,
        "size": size,
        "name": name,
        "extras": extras,
        "data_at": at + 30 + name_length + extra_length,
    }


class HashingSink:
    """Takes the ZIP's bytes and keeps only their SHA-256, their count and the first ``keep`` of them."""

    def __init__(self, keep: int = 4096) -> None:
        self._hash = hashlib.sha256()
        self._size = 0
        self._keep = keep
        self.head = bytearray()

    async def write(self, data: bytes) -> None:
        if len(self.head) < self._keep:
            self.head += data[: self._keep - len(self.head)]
        self._hash.update(data)
        self._size += len(data)

    def digest(self) -> Digest:
        return Digest(self._size, self._hash.hexdigest())

    async def finish(self) -> Digest:
        return self.digest()


class GeneratedObject:
    """An S3 client whose every object is ``size`` bytes of ``BLOCK`` repeated, made as they are read; it keeps
    the bodies it handed out."""

    def __init__(self, size: int) -> None:
        self._size = size
        self.bodies: list[_Body] = []

    async def get_object(self, **_: Any) -> dict[str, Any]:
        self.bodies.append(_Body(self._size))
        return {"Body": self.bodies[-1]}


class _Body:
    def __init__(self, size: int) -> None:
        self._size = size
        self.closed = False

    def close(self) -> None:
        self.closed = True

    async def __aenter__(self) -> _Body:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def iter_chunks(self, chunk_size: int) -> AsyncIterator[bytes]:
        left = self._size
        while left:
            chunk = BLOCK[: min(left, len(BLOCK))]
            left -= len(chunk)
            yield chunk


class NoMessages:
    """A reader of an export whose range holds no message."""

    async def write(self, files: Files, *, after: int, last: int, after_each: Callable[[], Awaitable[None]]) -> None:
        return None


def generated_crc32(size: int) -> int:
    crc32, left = 0, size
    while left:
        chunk = BLOCK[: min(left, len(BLOCK))]
        crc32 = zlib.crc32(chunk, crc32)
        left -= len(chunk)
    return crc32


async def test_a_five_gigabyte_file_gets_zip64_sizes_in_its_local_header() -> None:
    attachment = CarriedAttachment(
        "att_big", "big.bin", "application/octet-stream", FIVE_GB, "0" * 64, generated_crc32(FIVE_GB), "k", WHEN
    )
    sink = HashingSink()
    zipped = MediaZip(
        s3=GeneratedObject(FIVE_GB),
        bucket="b",
        key="k.zip",
        kind=FileKind("jsonl", zipped=True),
        conversation_id="c-big",
        reader=NoMessages(),
        writer=sink,
        plan=plan_media([attachment], types=None, max_file_bytes=None, max_total_bytes=None),
        carried=[attachment],
        modified_at=WHEN,
    )

    stored = await zipped.write(after=0, last=0, after_each=_nothing)

    header = local_header(bytes(sink.head), 0)
    assert header["name"] == "media/att_big/big.bin"
    assert (header["version"], header["flags"] & 0x08, header["method"]) == (45, 0, 0)
    assert (header["crc32"], header["compressed"], header["size"]) == (attachment.crc32, 0xFFFFFFFF, 0xFFFFFFFF)
    # The ZIP64 extra field: the original size, then the compressed size, 8 bytes each, little-endian.
    assert header["extras"][ZIP64_EXTRA] == struct.pack("<QQ", FIVE_GB, FIVE_GB)
    assert stored.size_bytes > FIVE_GB and stored.sha256 == sink.digest().sha256


async def test_zip64_forced_on_small_files_through_the_bucket(
    api: Client, auth: Auth, pool: asyncpg.Pool, s3: Any, settings: Settings, tmp_path: Path
) -> None:
    await make_conversation(api, auth, "c-z64", ["alice"])
    files = [await uploaded(api, auth, "alice", "c-z64", f"f{n}.bin", bytes([n]) * (1000 + n), "a/b") for n in range(3)]
    assert (
        await send_with(api, auth, "alice", "c-z64", "m-1", [item["attachment_id"] for item in files])
    ).status == 200
    request = ExportRequest(media=True)
    async with pool.acquire() as conn:
        carried = await export_reader.carried_attachments(
            conn, conversation_id="c-z64", after_seq=0, last_seq=1, request=request
        )
    kind = request.file_kind
    writer = ObjectWriter.in_bucket(s3, settings, key="z64.zip", content_type=kind.content_type)
    reader = RangeReader(
        source=ReadSource(primary=pool),
        settings=settings,
        operation_id="op-none",
        conversation_id="c-z64",
        request=request,
        kind=kind,
        split=False,
    )
    zipped = MediaZip(
        s3=s3,
        bucket=settings.s3_bucket,
        key="z64.zip",
        kind=kind,
        conversation_id="c-z64",
        reader=reader,
        writer=writer,
        plan=plan_media(carried, types=None, max_file_bytes=None, max_total_bytes=None),
        carried=carried,
        modified_at=WHEN,
        force_zip64=True,
    )

    await zipped.write(after=0, last=1, after_each=_nothing)

    content = await (await s3.get_object(Bucket=settings.s3_bucket, Key="z64.zip"))["Body"].read()
    archive = zipfile.ZipFile(io.BytesIO(content))
    for item in files:
        name = f"media/{item['attachment_id']}/{item['file_name']}"
        header = local_header(content, archive.getinfo(name).header_offset)
        assert (header["flags"] & 0x08, header["method"], header["size"]) == (0, 0, 0xFFFFFFFF)
        assert header["extras"][ZIP64_EXTRA] == struct.pack("<QQ", item["size_bytes"], item["size_bytes"])
        data = content[header["data_at"] : header["data_at"] + item["size_bytes"]]
        assert hashlib.sha256(data).hexdigest() == item["sha256"] and zlib.crc32(data) == header["crc32"]
    path = tmp_path / "z64.zip"
    path.write_bytes(content)
    tested = subprocess.run(["unzip", "-t", str(path)], capture_output=True, text=True, check=False)
    assert tested.returncode == 0, tested.stdout + tested.stderr


async def _nothing() -> None:
    return None


class FailingSink(HashingSink):
    async def write(self, data: bytes) -> None:
        raise OSError("the upload failed")


async def test_a_failed_zip_lets_go_of_the_file_it_began_to_fetch() -> None:
    files = [
        CarriedAttachment(
            f"att_{n}", f"f{n}.bin", "a/b", 3 * len(BLOCK), "0" * 64, generated_crc32(3 * len(BLOCK)), f"k{n}", WHEN
        )
        for n in range(2)
    ]
    s3 = GeneratedObject(3 * len(BLOCK))
    zipped = MediaZip(
        s3=s3,
        bucket="b",
        key="k.zip",
        kind=FileKind("jsonl", zipped=True),
        conversation_id="c-fail",
        reader=NoMessages(),
        writer=FailingSink(),
        plan=plan_media(files, types=None, max_file_bytes=None, max_total_bytes=None),
        carried=files,
        modified_at=WHEN,
    )

    with pytest.raises(OSError, match="upload failed"):
        await zipped.write(after=0, last=0, after_each=_nothing)

    # The second file's GET was in flight while the first streamed: its body is closed, not left to the collector.
    assert len(s3.bodies) == 2 and all(body.closed for body in s3.bodies)
