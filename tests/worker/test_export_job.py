"""One attempt's work on real Postgres and a moto server (docs/architecture.md: How it works; docs/states.md: States and
failure model): the export job writes and verifies the files and returns them as it recorded them; SUCCEEDED, like every
other end of an attempt, is the runner's to write.
"""

from __future__ import annotations

import hashlib
from typing import Any

import asyncpg

from services.worker.operation.job import ExportJob
from shared.repository.artifacts import StoredPart
from shared.repository.leases import ClaimedOperation
from shared.settings import Settings
from shared.storage import artifact_key
from tests.support import claims
from tests.support.rows import insert_operation

MIB = 1024 * 1024
# 1,200 messages of this size make about 12 MiB of JSONL: more than one upload part (8 MiB by default).
BODY_BYTES = 10_000


async def conversation(pool: asyncpg.Pool, *, messages: int, body_bytes: int) -> None:
    """c-a with alice as member and ``messages`` messages of ``body_bytes`` each."""
    await pool.execute("INSERT INTO conversations (conversation_id, last_seq) VALUES ('c-a', $1)", messages)
    await pool.execute("INSERT INTO conversation_members (conversation_id, user_id) VALUES ('c-a', 'alice')")
    await pool.execute(
        "INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at)"
        " SELECT 'c-a', n, 'm' || n, 'alice', repeat('x', $1), '2026-11-30T08:00:00Z'"
        " FROM generate_series(1, $2) AS n",
        body_bytes,
        messages,
    )


async def claimed(pool: asyncpg.Pool, settings: Settings, **columns: Any) -> ClaimedOperation:
    """op_1 (alice's export of c-a, with ``columns``) queued, then claimed as generation 1."""
    await insert_operation(pool, "op_1", "QUEUED", **columns)
    async with pool.acquire() as conn:
        return await claims.claim(conn, "op_1", "w1", lease_seconds=settings.lease_seconds)


async def stored(s3: Any, settings: Settings, key: str) -> bytes:
    response = await s3.get_object(Bucket=settings.s3_bucket, Key=key)
    async with response["Body"] as body:
        data: bytes = await body.read()
    return data


async def test_the_job_returns_the_verified_file_it_wrote_and_leaves_the_end_to_the_runner(
    pool: asyncpg.Pool, s3: Any, settings: Settings
) -> None:
    await conversation(pool, messages=3, body_bytes=2)
    claim = await claimed(pool, settings)

    written = await ExportJob(pool=pool, s3=s3, settings=settings, claimed=claim).write()

    key = artifact_key(settings, "op_1", 1, extension="jsonl", split=False)
    data = await stored(s3, settings, key)
    assert (written.generation, written.adopted, written.files.key) == (1, False, key)
    assert written.files.parts == (StoredPart(1, key, len(data), hashlib.sha256(data).hexdigest(), 3, None, None),)
    state = await pool.fetchval("SELECT state FROM operations WHERE operation_id = 'op_1'")
    artifact = await pool.fetchrow("SELECT state, sha256 FROM artifacts WHERE operation_id = 'op_1'")
    assert state == "RUNNING"
    # One PutObject: the SUCCEEDED commit publishes it from WRITING, with no round trip to record COMPLETE.
    assert tuple(artifact) == ("WRITING", None)


async def test_the_job_records_the_multipart_upload_its_file_began(
    pool: asyncpg.Pool, s3: Any, settings: Settings
) -> None:
    await conversation(pool, messages=1200, body_bytes=BODY_BYTES)
    claim = await claimed(pool, settings)

    written = await ExportJob(pool=pool, s3=s3, settings=settings, claimed=claim).write()

    assert written.files.size_bytes > settings.s3_part_size_bytes
    artifact = await pool.fetchrow("SELECT upload_id, state, sha256 FROM artifacts WHERE operation_id = 'op_1'")
    assert artifact["upload_id"] is not None
    # A multipart upload is recorded COMPLETE before the commit, so a takeover adopts it instead of writing it again.
    assert (artifact["state"], artifact["sha256"]) == ("COMPLETE", written.files.parts[0].sha256)


async def test_split_files_come_back_as_the_parts_s3_holds(pool: asyncpg.Pool, s3: Any, settings: Settings) -> None:
    await conversation(pool, messages=1200, body_bytes=BODY_BYTES)
    claim = await claimed(pool, settings, max_part_bytes=5 * MIB)

    written = await ExportJob(pool=pool, s3=s3, settings=settings, claimed=claim).write()

    folder = artifact_key(settings, "op_1", 1, extension="jsonl", split=True)
    parts = written.files.parts
    assert [part.number for part in parts] == [1, 2, 3]
    assert sum(part.message_count for part in parts) == 1200
    assert (parts[0].first_seq, parts[-1].last_seq) == (1, 1200)
    for part in parts:
        data = await stored(s3, settings, part.key)
        assert part.key == f"{folder}part-{part.number}.jsonl"
        assert (part.size_bytes, part.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        assert part.message_count == data.count(b"\n")
    assert await pool.fetchval("SELECT state FROM artifacts WHERE operation_id = 'op_1'") == "COMPLETE"
