"""A chunked export's assembly taken up from its checkpoint, on a moto server (docs/chunks.md: Chunked exports, A
coordinator's takeover): the assembly that resumes reads only the bytes after the checkpoint, and the file it
completes is byte for byte the chunks, with their SHA-256.
"""

from __future__ import annotations

import hashlib
import random
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY

from services.worker.chunked.assembly import Assembly, Checkpoint
from shared.object_writer import StoredBytesDiffer
from shared.repository.chunks import Chunk
from shared.settings import Settings
from shared.states import ChunkState

MIB = 1024 * 1024
READ = "chatexport_worker_assembly_bytes_read_total"


async def stored_chunks(s3: Any, settings: Settings, sizes: list[int]) -> tuple[list[Chunk], bytes]:
    """DONE chunks of ``sizes`` bytes (random, ten messages each) stored in the bucket, and the file they make."""
    rng = random.Random(len(sizes))
    found, whole = [], b""
    for number, size in enumerate(sizes, start=1):
        data = rng.randbytes(size)
        key = f"exports/op_1/chunks/{number}-g1.part"
        await s3.put_object(Bucket=settings.s3_bucket, Key=key, Body=data)
        found.append(chunk(number, key, data))
        whole += data
    return found, whole


def chunk(number: int, key: str, data: bytes) -> Chunk:
    return Chunk(
        chunk_no=number,
        after_seq=(number - 1) * 10,
        last_seq=number * 10,
        estimated_bytes=len(data),
        state=ChunkState.DONE,
        generation=1,
        attempts=1,
        lease_owner=None,
        lease_expires_at=None,
        object_key=key,
        messages_written=10,
        bytes_written=len(data),
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        message_count=10,
        first_message_seq=(number - 1) * 10 + 1,
        last_message_seq=number * 10,
        error_code=None,
        error_message=None,
        updated_at=datetime.now(UTC),
    )


def assembly(s3: Any, settings: Settings, checkpoints: list[Checkpoint]) -> Assembly:
    async def nothing(*_: object) -> None:
        return None

    async def record(checkpoint: Checkpoint) -> None:
        checkpoints.append(checkpoint)

    return Assembly(
        s3,
        settings,
        key="exports/op_1/g1.jsonl",
        content_type="application/jsonl",
        on_upload=nothing,
        after_part=nothing,
        on_checkpoint=record,
    )


def read_so_far() -> float:
    return REGISTRY.get_sample_value(READ) or 0.0


@pytest.mark.parametrize(
    "sizes",
    [
        # Under 5 MiB each: every byte goes through the buffer, and checkpoints fall inside chunks.
        [3 * MIB, 2 * MIB + 1234, 4 * MIB, 3 * MIB + 77, 1 * MIB],
        # Copied by S3 after a head that completes the part in the making.
        [6 * MIB + 5, 7 * MIB, 6 * MIB + 99, 2 * MIB],
    ],
    ids=["buffered", "copied"],
)
async def test_an_assembly_taken_up_from_its_checkpoint_reads_only_what_follows(
    s3: Any, settings: Settings, sizes: list[int]
) -> None:
    chunks, whole = await stored_chunks(s3, settings, sizes)
    checkpoints: list[Checkpoint] = []
    first = assembly(s3, settings, checkpoints)
    await first.start()
    for each in chunks[: len(chunks) // 2 + 1]:
        await first.add(each)
    # The first coordinator is lost here, its last checkpoint recorded.
    assert checkpoints
    last = Checkpoint.from_json(checkpoints[-1].as_json())
    assert last == checkpoints[-1]
    assert 0 < last.size_bytes < len(whole)

    before = read_so_far()
    second = assembly(s3, settings, [])
    second.resume(last)
    for each in chunks:
        await second.add(each)
    files = await second.finish()

    assert read_so_far() - before == len(whole) - last.size_bytes
    stored = await s3.get_object(Bucket=settings.s3_bucket, Key="exports/op_1/g1.jsonl")
    async with stored["Body"] as body:
        assert await body.read() == whole
    (part,) = files.parts
    assert (part.size_bytes, part.sha256, part.message_count) == (
        len(whole),
        hashlib.sha256(whole).hexdigest(),
        10 * len(chunks),
    )


async def test_a_checkpoint_of_another_chunk_is_refused(s3: Any, settings: Settings) -> None:
    chunks, _ = await stored_chunks(s3, settings, [3 * MIB, 3 * MIB, 3 * MIB])
    checkpoints: list[Checkpoint] = []
    first = assembly(s3, settings, checkpoints)
    await first.start()
    for each in chunks:
        await first.add(each)
    resumed_at = next(each for each in chunks if each.after_seq == checkpoints[-1].after_seq)
    rewritten = chunk(resumed_at.chunk_no, resumed_at.object_key or "", b"other bytes")
    second = assembly(s3, settings, [])
    second.resume(checkpoints[-1])
    with pytest.raises(StoredBytesDiffer, match="not the chunk the assembly's checkpoint names"):
        await second.add(rewritten)


def test_a_checkpoint_of_an_unknown_version_is_not_taken_up() -> None:
    assert Checkpoint.from_json('{"version": 99, "upload_id": "u"}') is None
