"""The object writer against a real moto server: parts, single PutObject, verification, abandon."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import tracemalloc
from typing import Any

import pytest

from shared.artifact_removal import remove_object
from shared.object_writer import Digest, ObjectWriter, StoredBytesDiffer, read_digest
from shared.settings import Settings

MIB = 1024 * 1024


def writer(s3: Any, settings: Settings, key: str) -> ObjectWriter:
    return ObjectWriter(
        s3,
        bucket=settings.s3_bucket,
        key=key,
        part_size=5 * MIB,
        timeout_seconds=settings.s3_timeout_seconds,
        content_type="application/x-ndjson",
    )


def payload(size: int) -> bytes:
    line = "".join(chr(0x4E00 + n % 500) for n in range(40)).encode() + b"\n"
    return (line * (size // len(line) + 1))[:size]


async def test_large_file_becomes_a_multipart_upload_with_matching_digest(s3: Any, settings: Settings) -> None:
    data = payload(12 * MIB + 123)
    artifact = writer(s3, settings, "exports/op/g1.jsonl")
    upload_ids: set[str | None] = set()
    for offset in range(0, len(data), 700_000):
        await artifact.write(data[offset : offset + 700_000])
        upload_ids.add(artifact.upload_id)
    digest = await artifact.finish()

    # None until the first part was full, then the one upload it began.
    assert upload_ids - {None} == {artifact.upload_id}
    assert artifact.upload_id is not None
    assert digest.size_bytes == len(data)
    assert digest.sha256 == hashlib.sha256(data).hexdigest()
    assert await read_digest(s3, bucket=settings.s3_bucket, key="exports/op/g1.jsonl") == digest
    head = await s3.head_object(Bucket=settings.s3_bucket, Key="exports/op/g1.jsonl")
    assert head["ContentLength"] == len(data)


class RecordingParts:
    """The real S3 client, remembering the body of every part it is asked to upload."""

    def __init__(self, s3: Any) -> None:
        self._s3 = s3
        self.bodies: list[bytes] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._s3, name)
        if name != "upload_part":
            return method

        async def recorded(**arguments: Any) -> Any:
            # A BytesIO's value is the very object it was made from while nothing wrote to it.
            self.bodies.append(arguments["Body"].getvalue())
            return await method(**arguments)

        return recorded


async def test_writes_across_part_boundaries_are_cut_into_whole_parts(s3: Any, settings: Settings) -> None:
    """Writes smaller than a part, exactly one, and over several, in every order: each part but the last is
    exactly a part long, the object holds the bytes in their order, and a write that is exactly one part
    (nothing pending before it) is uploaded as the caller's own object, not a copy.
    """
    data = payload(20 * MIB + 3)
    sizes = [3 * MIB, 2 * MIB, 5 * MIB, 7 * MIB + 1, 3 * MIB, 2]
    recording = RecordingParts(s3)
    artifact = writer(recording, settings, "exports/op/uneven.jsonl")
    written: list[bytes] = []
    offset = 0
    for size in sizes:
        written.append(data[offset : offset + size])
        offset += size
        await artifact.write(written[-1])
    digest = await artifact.finish()

    assert offset == len(data)
    assert [len(body) for body in recording.bodies] == [5 * MIB, 5 * MIB, 5 * MIB, 5 * MIB, 3]
    assert recording.bodies[1] is written[2]
    stored = await s3.get_object(Bucket=settings.s3_bucket, Key="exports/op/uneven.jsonl")
    async with stored["Body"] as body:
        assert await body.read() == data
    assert digest == Digest(len(data), hashlib.sha256(data).hexdigest())


async def test_a_part_is_joined_only_once_the_part_before_it_has_gone(s3: Any, settings: Settings) -> None:
    """Writes of 1 MiB each, none of them a whole part, so every part is joined from pieces: at the cut, the
    writer waits for the part in flight before it joins the next, so it never holds the pieces, the part being
    joined and the part in flight at once (three parts' worth), only two and what a write adds. The bound lies
    between the two, clear of each, so a library's own buffers moving by a MiB neither fails nor hides it.
    """
    data = payload(4 * 5 * MIB)
    artifact = writer(s3, settings, "exports/op/joined.jsonl")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for offset in range(0, len(data), MIB):
            # A copy per write, as a range read from Postgres is: the writer holds it until it is in a part.
            await artifact.write(data[offset : offset + MIB])
        digest = await artifact.finish()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()

    assert digest == Digest(len(data), hashlib.sha256(data).hexdigest())
    assert peak < 2.75 * 5 * MIB, f"held {peak / MIB:.1f} MiB at most for parts of 5 MiB"


async def test_small_and_empty_files_are_single_objects(s3: Any, settings: Settings) -> None:
    for key, data in (("exports/op/small.jsonl", payload(1000)), ("exports/op/empty.jsonl", b"")):
        artifact = writer(s3, settings, key)
        await artifact.write(data)
        digest = await artifact.finish()
        assert artifact.upload_id is None
        assert await read_digest(s3, bucket=settings.s3_bucket, key=key) == digest
        assert digest.size_bytes == len(data)


async def test_abandon_then_remove_object_leaves_no_object_and_no_upload(s3: Any, settings: Settings) -> None:
    artifact = writer(s3, settings, "exports/op/g2.jsonl")
    await artifact.write(payload(11 * MIB))
    uploads = await s3.list_multipart_uploads(Bucket=settings.s3_bucket)
    assert [upload["UploadId"] for upload in uploads["Uploads"]] == [artifact.upload_id]
    await artifact.abandon()
    await remove_object(s3, bucket=settings.s3_bucket, key="exports/op/g2.jsonl")

    uploads = await s3.list_multipart_uploads(Bucket=settings.s3_bucket)
    assert uploads.get("Uploads", []) == []
    listed = await s3.list_objects_v2(Bucket=settings.s3_bucket, Prefix="exports/op/")
    assert listed.get("KeyCount", 0) == 0


class ChangedOnTheWay:
    """The real S3 client, but the body of the ``upload``-th upload request (PutObject or UploadPart, from
    1) loses its last byte and gains another after the writer hashed it: a byte changed on the way.
    """

    def __init__(self, s3: Any, *, upload: int) -> None:
        self._s3 = s3
        self._upload = upload
        self._seen = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._s3, name)
        if name not in ("put_object", "upload_part"):
            return method

        async def changed(**arguments: Any) -> Any:
            self._seen += 1
            if self._seen == self._upload:
                body = arguments["Body"]
                sent = body if isinstance(body, bytes) else body.getvalue()  # a part's is a BytesIO
                arguments["Body"] = sent[:-1] + b"!"
            return await method(**arguments)

        return changed


@pytest.mark.parametrize(("size", "upload"), [(1000, 1), (12 * MIB, 2), (12 * MIB, 3)])
async def test_bytes_changed_on_the_way_to_s3_fail_the_upload(
    s3: Any, settings: Settings, size: int, upload: int
) -> None:
    artifact = writer(ChangedOnTheWay(s3, upload=upload), settings, "exports/op/g3.jsonl")
    with pytest.raises(StoredBytesDiffer):
        await artifact.write(payload(size))
        await artifact.finish()


async def test_a_listing_during_a_large_put_leaves_its_etag_the_md5_of_the_bytes_sent(
    s3: Any, settings: Settings
) -> None:
    """The janitor lists the whole prefix while an export's last PutObject is stored: the S3 emulator must still
    answer that PutObject with the MD5 of its bytes (``devtools.s3_emulator``). A body that the emulator spills
    to disk (34 MiB) is what an unserialised ETag scrambled every time.
    """
    data = payload(34 * MIB)
    listed = 0

    async def list_the_prefix() -> None:
        nonlocal listed
        while True:
            await s3.list_objects_v2(Bucket=settings.s3_bucket, Prefix="exports/")
            listed += 1

    for generation in range(1, 4):
        lister = asyncio.create_task(list_the_prefix())
        try:
            artifact = ObjectWriter(
                s3,
                bucket=settings.s3_bucket,
                key=f"exports/op/g{generation}.jsonl",
                part_size=64 * MIB,
                timeout_seconds=settings.s3_timeout_seconds,
                content_type="application/x-ndjson",
            )
            await artifact.write(data)
            digest = await artifact.finish()  # raises StoredBytesDiffer on a scrambled ETag
        finally:
            lister.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lister
        assert artifact.upload_id is None
        assert digest.sha256 == hashlib.sha256(data).hexdigest()
    assert listed >= 3
