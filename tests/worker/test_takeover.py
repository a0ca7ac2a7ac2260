"""Takeovers on real Postgres and a moto server (docs/states.md: States and failure model, Unknown outcomes): the new
generation adopts an earlier generation's verified object or removes what it left, and a superseded holder's writes are
rejected and counted without touching the published object.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from services.worker.chunked.assembly import Checkpoint
from services.worker.chunked.sha256_state import ResumableSha256
from services.worker.operation.runner import LeaseRunner
from shared.artifact_removal import remove_artifact
from shared.repository import artifacts
from shared.repository.artifacts import ArtifactFiles, StoredPart
from shared.repository.leases import ClaimedOperation
from shared.settings import Settings
from shared.storage import artifact_key
from tests.support import claims, wait_for
from tests.support.bucket import keys, open_uploads
from tests.support.rows import insert_artifact, insert_operation

MIB = 1024 * 1024
LINE = (
    '{{"conversation_id":"c-a","seq":{seq},"message_id":"m{seq}","sender_id":"alice","sent_at":"{at}","body":"hi"}}\n'
)


@pytest.fixture
async def conversation(pool: asyncpg.Pool) -> None:
    """c-a with alice as member and messages 1..3."""
    await pool.execute("INSERT INTO conversations (conversation_id, last_seq) VALUES ('c-a', 3)")
    await pool.execute("INSERT INTO conversation_members (conversation_id, user_id) VALUES ('c-a', 'alice')")
    for seq in (1, 2, 3):
        await pool.execute(
            "INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at)"
            " VALUES ('c-a', $1, $2, 'alice', 'hi', '2026-11-30T08:00:00Z')",
            seq,
            f"m{seq}",
        )


def expected_file() -> bytes:
    return "".join(LINE.format(seq=seq, at="2026-11-30T08:00:00.000Z") for seq in (1, 2, 3)).encode()


async def abandoned_at_generation_one(pool: asyncpg.Pool) -> None:
    """op_1 RUNNING under generation 1 whose lease has expired: its worker is gone."""
    await insert_operation(
        pool,
        "op_1",
        "RUNNING",
        generation=1,
        attempt=1,
        snapshot_max_seq=3,
        lease_owner="gone",
        progress_phase="writing",
    )
    await pool.execute("UPDATE operations SET lease_expires_at = now() - interval '1 second'")


async def take_over(pool: asyncpg.Pool, s3: Any, settings: Settings, *, then: str | None = None) -> ClaimedOperation:
    """Claim op_1 as generation 2, run ``then`` (SQL) as if another party acted meanwhile, then run it."""
    async with pool.acquire() as conn:
        claimed = await claims.claim(conn, "op_1", "w2", lease_seconds=settings.lease_seconds)
    assert claimed.generation == 2
    if then is not None:
        await pool.execute(then)
    await LeaseRunner(pool=pool, s3=s3, settings=settings).run(claimed)
    return claimed


async def complete_generation_one(pool: asyncpg.Pool, s3: Any, settings: Settings) -> str:
    """An abandoned op_1 whose generation 1 uploaded and verified the right file."""
    await abandoned_at_generation_one(pool)
    data = expected_file()
    key = await insert_artifact(pool, "op_1", 1, "COMPLETE", data=data)
    await s3.put_object(Bucket=settings.s3_bucket, Key=key, Body=data)
    return key


async def operation(pool: asyncpg.Pool) -> asyncpg.Record:
    found = await pool.fetchrow("SELECT * FROM operations WHERE operation_id = 'op_1'")
    assert found is not None
    return found


async def artifact_states(pool: asyncpg.Pool) -> dict[int, str]:
    rows = await pool.fetch("SELECT generation, state FROM artifacts WHERE operation_id = 'op_1'")
    return {row["generation"]: row["state"] for row in rows}


async def published_its_own(pool: asyncpg.Pool, settings: Settings, *, split: bool = False) -> asyncpg.Record:
    """Assert that op_1 SUCCEEDED with generation 2's own file (a folder of parts when ``split``), generation 1's
    record removed; return the operation's row.
    """
    row = await operation(pool)
    key = artifact_key(settings, "op_1", 2, extension="jsonl", split=split)
    assert (row["state"], row["result_key"]) == ("SUCCEEDED", key)
    assert await artifact_states(pool) == {1: "DELETED", 2: "PUBLISHED"}
    return row


async def test_a_takeover_adopts_the_earlier_generations_verified_object(
    pool: asyncpg.Pool, s3: Any, settings: Settings, conversation: None
) -> None:
    key = await complete_generation_one(pool, s3, settings)
    data = expected_file()
    adopted_before = REGISTRY.get_sample_value("chatexport_worker_artifacts_adopted_total") or 0.0

    await take_over(pool, s3, settings)

    row = await operation(pool)
    assert (row["state"], row["generation"], row["result_key"]) == ("SUCCEEDED", 2, key)
    assert row["result_sha256"] == hashlib.sha256(data).hexdigest()
    # Generation 2's record, which its claim made and nothing was written under, goes with the commit.
    assert await artifact_states(pool) == {1: "PUBLISHED", 2: "DELETED"}
    assert await keys(s3, settings) == {key}
    assert REGISTRY.get_sample_value("chatexport_worker_artifacts_adopted_total") == adopted_before + 1


@pytest.mark.parametrize(
    ("meanwhile", "state", "error_code"),
    [
        ("DELETE FROM conversation_members WHERE user_id = 'alice'", "FAILED", "ACCESS_REVOKED"),
        ("UPDATE operations SET state = 'CANCEL_REQUESTED'", "CANCELED", None),
    ],
)
async def test_an_adoption_refused_by_access_or_a_cancel_removes_the_object(
    pool: asyncpg.Pool, s3: Any, settings: Settings, conversation: None, meanwhile: str, state: str, error_code: str
) -> None:
    await complete_generation_one(pool, s3, settings)

    await take_over(pool, s3, settings, then=meanwhile)

    row = await operation(pool)
    assert (row["state"], row["error_code"], row["result_key"]) == (state, error_code, None)
    assert await artifact_states(pool) == {1: "DELETED", 2: "DELETED"}
    assert await keys(s3, settings) == set()


async def test_a_takeover_removes_a_partial_object_and_its_open_upload_then_writes_its_own(
    pool: asyncpg.Pool, s3: Any, settings: Settings, conversation: None
) -> None:
    await abandoned_at_generation_one(pool)
    old_key = await insert_artifact(pool, "op_1", 1, "WRITING", data=b"")
    await s3.create_multipart_upload(Bucket=settings.s3_bucket, Key=old_key)

    await take_over(pool, s3, settings)

    new_key = (await published_its_own(pool, settings))["result_key"]
    assert await keys(s3, settings) == {new_key}
    assert await open_uploads(s3, settings) == set()
    stored = await s3.get_object(Bucket=settings.s3_bucket, Key=new_key)
    async with stored["Body"] as body:
        assert await body.read() == expected_file()


async def test_a_checkpoint_whose_upload_is_gone_is_removed_not_resumed(
    pool: asyncpg.Pool, s3: Any, settings: Settings, conversation: None
) -> None:
    # Generation 1 recorded an assembly's checkpoint; its upload was aborted since.
    await abandoned_at_generation_one(pool)
    old_key = await insert_artifact(pool, "op_1", 1, "WRITING", data=b"")
    created = await s3.create_multipart_upload(Bucket=settings.s3_bucket, Key=old_key)
    await s3.abort_multipart_upload(Bucket=settings.s3_bucket, Key=old_key, UploadId=created["UploadId"])
    checkpoint = Checkpoint(
        upload_id=created["UploadId"],
        parts=(),
        size_bytes=0,
        messages=0,
        after_seq=0,
        chunk_sha256=None,
        offset=0,
        file_state=ResumableSha256().state().hex(),
        chunk_state=ResumableSha256().state().hex(),
    )
    await pool.execute("UPDATE artifacts SET assembly = $1::jsonb WHERE generation = 1", checkpoint.as_json())
    resumed_before = REGISTRY.get_sample_value("chatexport_worker_assemblies_resumed_total") or 0.0

    await take_over(pool, s3, settings)

    await published_its_own(pool, settings)
    assert REGISTRY.get_sample_value("chatexport_worker_assemblies_resumed_total") == resumed_before


async def test_an_object_whose_removal_died_halfway_is_never_adopted(
    pool: asyncpg.Pool, s3: Any, settings: Settings, conversation: None
) -> None:
    # A removal marked the record REMOVING, then died before deleting the object from S3.
    await abandoned_at_generation_one(pool)
    data = expected_file()
    key = await insert_artifact(pool, "op_1", 1, "REMOVING", data=data)
    await s3.put_object(Bucket=settings.s3_bucket, Key=key, Body=data)

    await take_over(pool, s3, settings)

    await published_its_own(pool, settings)
    assert await keys(s3, settings) == {artifact_key(settings, "op_1", 2, extension="jsonl", split=False)}


async def test_a_complete_object_that_no_longer_matches_its_record_is_not_adopted(
    pool: asyncpg.Pool, s3: Any, settings: Settings, conversation: None
) -> None:
    await abandoned_at_generation_one(pool)
    key = await insert_artifact(pool, "op_1", 1, "COMPLETE", data=expected_file())
    await s3.put_object(Bucket=settings.s3_bucket, Key=key, Body=b"truncated\n")

    await take_over(pool, s3, settings)

    row = await published_its_own(pool, settings)
    assert row["result_sha256"] == hashlib.sha256(expected_file()).hexdigest()


async def test_a_served_result_is_never_removed_until_it_expires(
    pool: asyncpg.Pool, s3: Any, settings: Settings, conversation: None
) -> None:
    key = artifact_key(settings, "op_1", 1, extension="jsonl", split=False)
    await insert_operation(pool, "op_1", "SUCCEEDED", generation=2, result_key=key)
    await insert_artifact(pool, "op_1", 1, "PUBLISHED", data=b"x\n")
    await s3.put_object(Bucket=settings.s3_bucket, Key=key, Body=b"x\n")

    # The superseded generation 1 tries to clean up after its rejected publish: refused.
    assert not await remove_artifact(pool, s3, bucket=settings.s3_bucket, operation_id="op_1", generation=1)
    assert await keys(s3, settings) == {key}
    assert await artifact_states(pool) == {1: "PUBLISHED"}

    await pool.execute("UPDATE operations SET state = 'EXPIRED'")
    assert await remove_artifact(pool, s3, bucket=settings.s3_bucket, operation_id="op_1", generation=1)
    assert await keys(s3, settings) == set()
    assert await artifact_states(pool) == {1: "DELETED"}


async def test_a_superseded_holders_writes_are_rejected_and_counted(
    pool: asyncpg.Pool, s3: Any, settings: Settings, conversation: None
) -> None:
    await insert_operation(pool, "op_1", "QUEUED")
    async with pool.acquire() as conn:
        first = await claims.claim(conn, "op_1", "w1", lease_seconds=settings.lease_seconds)
        await conn.execute("UPDATE operations SET lease_expires_at = now() - interval '1 second'")
        await claims.claim(conn, "op_1", "w2", lease_seconds=settings.lease_seconds)
    sample = "chatexport_worker_stale_generation_writes_total"
    before = REGISTRY.get_sample_value(sample, {"write": "result"}) or 0.0

    # The old holder wakes up and runs its lease: a small export's first fenced write is its SUCCEEDED commit,
    # refused, and what it uploaded is removed.
    await LeaseRunner(pool=pool, s3=s3, settings=settings).run(first)

    row = await operation(pool)
    assert (row["state"], row["generation"], row["lease_owner"]) == ("RUNNING", 2, "w2")
    assert await artifact_states(pool) == {1: "DELETED", 2: "WRITING"}
    assert await keys(s3, settings) == set()
    assert REGISTRY.get_sample_value(sample, {"write": "result"}) == before + 1


async def test_a_removal_that_commits_first_wins_over_an_adoption_waiting_on_the_row(
    pool: asyncpg.Pool, s3: Any, settings: Settings, conversation: None
) -> None:
    await complete_generation_one(pool, s3, settings)
    remover = await pool.acquire()
    try:
        removal = remover.transaction()
        await removal.start()
        await remover.execute("SELECT 1 FROM artifacts WHERE operation_id = 'op_1' AND generation = 1 FOR UPDATE")
        adoption = asyncio.create_task(take_over(pool, s3, settings))
        # The adopter verified the object and now waits for the row, inside its SUCCEEDED transaction.
        await wait_for(lambda: _waits_for_a_lock(pool), timeout=30)
        await remover.execute("UPDATE artifacts SET state = 'REMOVING' WHERE operation_id = 'op_1' AND generation = 1")
        await removal.commit()
        await asyncio.wait_for(adoption, timeout=60)
    finally:
        await pool.release(remover)

    await published_its_own(pool, settings)
    assert await keys(s3, settings) == {artifact_key(settings, "op_1", 2, extension="jsonl", split=False)}


async def test_the_old_holder_cannot_complete_an_artifact_that_is_being_removed(
    pool: asyncpg.Pool, settings: Settings, conversation: None
) -> None:
    await abandoned_at_generation_one(pool)
    await insert_artifact(pool, "op_1", 1, "WRITING", data=b"")
    async with pool.acquire() as conn:
        assert await artifacts.start_removal(conn, operation_id="op_1", generation=1) is not None
        completed = await artifacts.complete_artifact(
            conn,
            operation_id="op_1",
            generation=1,
            files=ArtifactFiles.one_file("k", size_bytes=1, sha256="0" * 64, message_count=1),
        )
    assert not completed
    assert await artifact_states(pool) == {1: "REMOVING"}


async def _waits_for_a_lock(pool: asyncpg.Pool) -> bool:
    waiting: int = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return waiting > 0


async def test_a_takeover_refused_at_start_removes_what_earlier_generations_left(
    pool: asyncpg.Pool, s3: Any, settings: Settings, conversation: None
) -> None:
    await complete_generation_one(pool, s3, settings)
    await pool.execute("DELETE FROM conversation_members WHERE user_id = 'alice'")
    async with pool.acquire() as conn:
        row = await claims.claim(conn, "op_1", "w2", lease_seconds=settings.lease_seconds)

    await LeaseRunner(pool=pool, s3=s3, settings=settings).refuse(row)

    row = await operation(pool)
    assert (row["state"], row["error_code"], row["generation"]) == ("FAILED", "ACCESS_REVOKED", 2)
    assert await artifact_states(pool) == {1: "DELETED", 2: "DELETED"}
    assert await keys(s3, settings) == set()


async def split_generation_one(pool: asyncpg.Pool, s3: Any, settings: Settings, state: str) -> tuple[str, bytes]:
    """An abandoned op_1 asking for parts, whose generation 1 recorded its folder in ``state`` and stored the
    one part the three messages fill (with its figures recorded when COMPLETE); (folder, part's bytes).
    """
    await abandoned_at_generation_one(pool)
    await pool.execute("UPDATE operations SET max_part_bytes = $1", 5 * MIB)
    folder = artifact_key(settings, "op_1", 1, extension="jsonl", split=True)
    data = expected_file()
    part = StoredPart(1, f"{folder}part-1.jsonl", len(data), hashlib.sha256(data).hexdigest(), 3, 1, 3)
    files = ArtifactFiles(folder, (part,), split=True)
    await pool.execute(
        "INSERT INTO artifacts (operation_id, generation, object_key, state, size_bytes, message_count, parts)"
        " VALUES ('op_1', 1, $1, $2, $3, 3, $4::jsonb)",
        folder,
        state,
        len(data),
        files.parts_json() if state == "COMPLETE" else None,
    )
    await s3.put_object(Bucket=settings.s3_bucket, Key=part.key, Body=data)
    return folder, data


async def test_a_takeover_adopts_an_earlier_generations_verified_parts(
    pool: asyncpg.Pool, s3: Any, settings: Settings, conversation: None
) -> None:
    folder, data = await split_generation_one(pool, s3, settings, "COMPLETE")

    await take_over(pool, s3, settings)

    row = await operation(pool)
    assert (row["state"], row["result_key"], row["result_size_bytes"], row["result_sha256"]) == (
        "SUCCEEDED",
        folder,
        None,
        None,
    )
    assert [part["sha256"] for part in json.loads(row["result_parts"])] == [hashlib.sha256(data).hexdigest()]
    assert await artifact_states(pool) == {1: "PUBLISHED", 2: "DELETED"}
    assert await keys(s3, settings) == {f"{folder}part-1.jsonl"}


@pytest.mark.parametrize("state", ["COMPLETE", "WRITING"])
async def test_a_takeover_removes_earlier_parts_it_cannot_adopt_and_writes_its_own(
    pool: asyncpg.Pool, s3: Any, settings: Settings, conversation: None, state: str
) -> None:
    folder, _ = await split_generation_one(pool, s3, settings, state)
    # A part whose bytes changed after they were verified, and a part upload left open.
    await s3.put_object(Bucket=settings.s3_bucket, Key=f"{folder}part-1.jsonl", Body=b"changed\n")
    await s3.create_multipart_upload(Bucket=settings.s3_bucket, Key=f"{folder}part-2.jsonl")

    await take_over(pool, s3, settings)

    new_folder = (await published_its_own(pool, settings, split=True))["result_key"]
    assert await keys(s3, settings) == {f"{new_folder}part-1.jsonl"}
    assert await open_uploads(s3, settings) == set()
    stored = await s3.get_object(Bucket=settings.s3_bucket, Key=f"{new_folder}part-1.jsonl")
    assert await stored["Body"].read() == expected_file()
