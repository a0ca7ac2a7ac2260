"""Leases and fencing in the worker's SQL (docs/states.md: States and failure model), on a real Postgres:
every write of a holder whose generation was superseded changes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from shared.export.formats import COMPRESSIONS, FORMAT_NAMES, FileKind
from shared.export.phases import Phase
from shared.repository import leases
from shared.repository.artifacts import ArtifactFiles
from shared.repository.leases import ClaimedOperation, finish_cancel
from shared.settings import Settings
from shared.storage import artifact_key
from tests.support import claims
from tests.support.rows import S3_PREFIX

LEASE = 30.0
# Every kind of file an export writes: (format, compression, media, split).
KINDS = [
    (name, compression, media, split)
    for name in FORMAT_NAMES
    for compression in COMPRESSIONS
    for media in (False, True)
    for split in (False, True)
    if not (media and compression == "gzip")
]
NOTHING_TO_RUN = leases.ExportClaim(parked=False, claimed=None, member=False)


@pytest.fixture
async def conn(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    async with pool.acquire() as connection:
        await connection.execute("INSERT INTO conversations (conversation_id, last_seq) VALUES ('c-a', 7)")
        await connection.execute(
            "INSERT INTO operations (operation_id, owner_id, conversation_id, format, state)"
            " VALUES ('op_1', 'alice', 'c-a', 'jsonl', 'QUEUED')"
        )
        yield connection


async def claim_export(
    conn: asyncpg.Connection, worker_id: str, *, max_attempts: int = claims.NEVER_PARKED
) -> leases.ExportClaim:
    return await claims.claim_export(conn, "op_1", worker_id, lease_seconds=LEASE, max_attempts=max_attempts)


async def claim(conn: asyncpg.Connection, worker_id: str) -> ClaimedOperation:
    return await claims.claim(conn, "op_1", worker_id, lease_seconds=LEASE)


async def add_member(conn: asyncpg.Connection) -> None:
    """alice, op_1's owner, joins c-a."""
    await conn.execute("INSERT INTO conversation_members (conversation_id, user_id) VALUES ('c-a', 'alice')")


def files_of(generation: int) -> ArtifactFiles:
    return ArtifactFiles.one_file(f"exports/op_1/g{generation}.jsonl", size_bytes=1, sha256="s", message_count=1)


async def succeed_export(conn: asyncpg.Connection, claimed: ClaimedOperation) -> leases.SucceedOutcome:
    return await leases.succeed_export(
        conn,
        claimed=claimed,
        files=files_of(claimed.generation),
        artifact_generation=claimed.generation,
        result_ttl_seconds=60,
    )


async def artifact_rows(conn: asyncpg.Connection) -> list[tuple[int, str, str]]:
    rows = await conn.fetch("SELECT generation, object_key, state FROM artifacts ORDER BY generation")
    return [tuple(found) for found in rows]


async def expire_lease(conn: asyncpg.Connection) -> None:
    await conn.execute("UPDATE operations SET lease_expires_at = now() - interval '1 second'")


async def row(conn: asyncpg.Connection) -> asyncpg.Record:
    found = await conn.fetchrow("SELECT * FROM operations WHERE operation_id = 'op_1'")
    assert found is not None
    return found


async def test_a_live_lease_cannot_be_claimed_and_an_expired_one_is_taken_over(conn: asyncpg.Connection) -> None:
    first = await claim(conn, "w1")
    assert (first.generation, first.attempt, first.snapshot_max_seq) == (1, 1, 7)
    assert first.took_over is False
    assert await claim_export(conn, "w2") == NOTHING_TO_RUN

    await conn.execute("UPDATE conversations SET last_seq = 9")
    await expire_lease(conn)
    second = await claim(conn, "w2")
    assert (second.generation, second.attempt, second.took_over) == (2, 2, True)
    # Fixed by the first attempt, reused by every retry (docs/api.md: Operations, Operation).
    assert second.snapshot_max_seq == 7


async def function_calls(conn: asyncpg.Connection, function: str) -> int:
    """How often ``function`` ran in the connection's open transaction (under ``track_functions``)."""
    calls = await conn.fetchval("SELECT pg_stat_get_xact_function_calls($1::regproc)", function)
    return int(calls or 0)


async def test_the_claim_and_the_commit_raise_the_version_once_without_the_trigger(conn: asyncpg.Connection) -> None:
    """They raise the version in their own statements, and the claim fixes the snapshot's edit version as the
    trigger would; the trigger still versions every other update (docs/benchmark.md: The claim's own steps).
    """
    await add_member(conn)
    await conn.execute("UPDATE conversations SET last_edit_version = 4")
    before = (await row(conn))["version"]
    async with conn.transaction():
        await conn.execute("SET LOCAL track_functions = 'pl'")
        claimed = await claim(conn, "w1")
        claimed_row = await row(conn)
        assert (claimed_row["version"], claimed_row["snapshot_edit_version"]) == (before + 1, 4)
        assert await succeed_export(conn, claimed) is leases.SucceedOutcome.SUCCEEDED
        assert (await row(conn))["version"] == before + 2
        assert await function_calls(conn, "operation_versioned") == 0
        await conn.execute("UPDATE operations SET result_size_bytes = 2")
        assert ((await row(conn))["version"], await function_calls(conn, "operation_versioned")) == (before + 3, 1)


async def test_a_claim_parks_and_supersedes_only_when_there_is_something_to(conn: asyncpg.Connection) -> None:
    """The first claim has no older attempt to supersede and nothing to park, a takeover supersedes, and the
    claim after the last attempt's lease expired parks (docs/benchmark.md: The claim's calls assigned).
    """
    await add_member(conn)

    async def parks_and_supersedes() -> tuple[int, int]:
        return await function_calls(conn, "park_abandoned"), await function_calls(conn, "supersede_attempts")

    async with conn.transaction():
        await conn.execute("SET LOCAL track_functions = 'pl'")
        first = await claim_export(conn, "w1", max_attempts=2)
        assert first.claimed is not None and not first.claimed.took_over
        assert await parks_and_supersedes() == (0, 0)
        await expire_lease(conn)
        second = await claim_export(conn, "w2", max_attempts=2)
        assert second.claimed is not None and second.claimed.took_over
        assert await parks_and_supersedes() == (0, 1)
        await expire_lease(conn)
        third = await claim_export(conn, "w3", max_attempts=2)
        assert third.parked and third.claimed is None
        assert await parks_and_supersedes() == (1, 1)


async def test_every_write_of_a_superseded_generation_changes_nothing(conn: asyncpg.Connection) -> None:
    # A member, so that only the lease can refuse the old holder's SUCCEEDED.
    await add_member(conn)
    first = await claim(conn, "w1")
    await expire_lease(conn)
    second = await claim(conn, "w2")
    before = await row(conn)
    # Each claim recorded its generation's artifact before any byte.
    recorded = [(1, "exports/op_1/g1.jsonl", "WRITING"), (2, "exports/op_1/g2.jsonl", "WRITING")]
    assert await artifact_rows(conn) == recorded

    old: dict[str, Any] = {"operation_id": "op_1", "generation": 1}
    assert not await leases.extend_lease(conn, **old, lease_seconds=LEASE)
    assert not await leases.record_progress(
        conn, **old, phase=Phase.WRITING, messages_written=5, bytes_written=50, lease_seconds=LEASE
    )
    assert await succeed_export(conn, first) is leases.SucceedOutcome.LEASE_LOST
    assert not await leases.end_attempt(conn, **old, state="FAILED", error_code="X", error_message="x")
    assert not await leases.hand_back(conn, **old)
    assert await row(conn) == before
    assert await artifact_rows(conn) == recorded

    await claims.verified_artifact(conn, second, files_of(2))
    assert await succeed_export(conn, second) is leases.SucceedOutcome.SUCCEEDED
    assert (await row(conn))["state"] == "SUCCEEDED"


async def test_after_a_cancel_request_success_is_impossible_but_the_holder_keeps_its_lease(
    conn: asyncpg.Connection,
) -> None:
    # A member with its file verified, so that only the cancel request can refuse the SUCCEEDED.
    await add_member(conn)
    claimed = await claim(conn, "w1")
    await claims.verified_artifact(conn, claimed, files_of(1))
    await conn.execute("UPDATE operations SET state = 'CANCEL_REQUESTED'")
    held: dict[str, Any] = {"operation_id": "op_1", "generation": 1}

    assert await succeed_export(conn, claimed) is leases.SucceedOutcome.LEASE_LOST
    assert not await leases.record_progress(
        conn, **held, phase=Phase.WRITING, messages_written=1, bytes_written=1, lease_seconds=LEASE
    )
    assert await leases.extend_lease(conn, **held, lease_seconds=LEASE)
    assert not await finish_cancel(conn, operation_id="op_1", generation=2, abandoned=False)
    assert await finish_cancel(conn, **held, abandoned=False)
    assert (await row(conn))["state"] == "CANCELED"


async def test_a_handed_back_lease_is_taken_over_at_once_without_spending_an_attempt(
    conn: asyncpg.Connection,
) -> None:
    await claim(conn, "w1")
    assert await leases.hand_back(conn, operation_id="op_1", generation=1)
    taken = await claim(conn, "w2")
    assert (taken.generation, taken.attempt, taken.took_over) == (2, 1, False)  # given, not taken


async def test_a_retry_is_claimable_only_once_its_time_has_come(conn: asyncpg.Connection) -> None:
    await claim(conn, "w1")
    assert await leases.end_attempt(
        conn,
        operation_id="op_1",
        generation=1,
        state="RETRY_AT",
        error_code="TIMEOUT",
        error_message="t",
        retry_delay_seconds=60,
    )
    assert await claim_export(conn, "w2") == NOTHING_TO_RUN
    await conn.execute("UPDATE operations SET retry_at = now() - interval '1 second'")
    retried = await claim(conn, "w2")
    assert retried.generation == 2
    assert (await row(conn))["error_code"] is None


async def test_an_operation_that_lost_its_worker_on_every_attempt_is_parked(conn: asyncpg.Connection) -> None:
    for _ in range(3):
        await expire_lease(conn)
        taken = await claim_export(conn, "w", max_attempts=3)
        assert not taken.parked and taken.claimed is not None
    assert await claim_export(conn, "w", max_attempts=3) == NOTHING_TO_RUN  # lease live
    await expire_lease(conn)
    assert (await claim_export(conn, "w", max_attempts=3)).parked
    parked = await row(conn)
    assert (parked["state"], parked["error_code"], parked["lease_expires_at"]) == ("FAILED_REPAIR", "WORKER_LOST", None)
    assert await claim_export(conn, "w") == NOTHING_TO_RUN


async def test_the_claim_call_parks_claims_and_reads_the_membership_in_one_round_trip(
    conn: asyncpg.Connection,
) -> None:
    await add_member(conn)
    first = await claim_export(conn, "w1")
    assert first.claimed is not None and not first.parked and first.member
    assert (first.claimed.generation, first.claimed.snapshot_max_seq, first.claimed.took_over) == (1, 7, False)
    assert (await claim_export(conn, "w2")) == NOTHING_TO_RUN

    await conn.execute("DELETE FROM conversation_members")
    await expire_lease(conn)
    second = await claim_export(conn, "w2")
    assert second.claimed is not None and second.claimed.took_over and not second.member
    assert await conn.fetch("SELECT generation, outcome FROM attempts ORDER BY generation") == [
        (1, "LEASE_LOST"),
        (2, None),
    ]

    await expire_lease(conn)
    parked = await claim_export(conn, "w3", max_attempts=2)
    assert parked == leases.ExportClaim(parked=True, claimed=None, member=False)
    assert ((await row(conn))["state"], (await row(conn))["error_code"]) == ("FAILED_REPAIR", "WORKER_LOST")


async def test_the_succeeded_call_writes_nothing_unless_member_lease_and_artifact_all_hold(
    conn: asyncpg.Connection,
) -> None:
    claimed = await claim(conn, "w1")
    await claims.verified_artifact(conn, claimed, files_of(1))
    before = await row(conn)

    assert await succeed_export(conn, claimed) is leases.SucceedOutcome.NOT_MEMBER
    await add_member(conn)
    stale = dataclasses.replace(claimed, generation=0)
    assert await succeed_export(conn, stale) is leases.SucceedOutcome.LEASE_LOST
    await conn.execute("UPDATE artifacts SET state = 'REMOVING'")
    async with conn.transaction():
        assert await succeed_export(conn, claimed) is leases.SucceedOutcome.ARTIFACT_GONE
        assert await conn.fetchval("SELECT 1") == 1  # the caller's transaction goes on
    # The SUCCEEDED write that came before the missing artifact was rolled back with the call.
    assert await row(conn) == before
    assert await conn.fetchval("SELECT outcome FROM attempts") is None

    await conn.execute("UPDATE artifacts SET state = 'COMPLETE'")
    assert await succeed_export(conn, claimed) is leases.SucceedOutcome.SUCCEEDED
    assert (await row(conn))["state"] == "SUCCEEDED"
    assert await conn.fetchval("SELECT state FROM artifacts") == "PUBLISHED"
    assert await conn.fetchval("SELECT outcome FROM attempts") == "SUCCEEDED"


async def test_a_column_added_while_workers_run_leaves_their_claims_working(conn: asyncpg.Connection) -> None:
    # A rolling deploy migrates while the previous release still claims (docs/deploy.md: Rolling deploys).
    assert (await claim_export(conn, "w1")).claimed is not None  # the claim's statement is now cached
    await conn.execute("ALTER TABLE operations ADD COLUMN added_later text")
    await expire_lease(conn)
    again = await claim_export(conn, "w2")
    assert again.claimed is not None and again.claimed.generation == 2
    assert await conn.fetchval("SELECT lease_owner FROM operations") == "w2"


@pytest.mark.parametrize("kind", KINDS, ids=str)
async def test_the_claim_records_the_key_the_worker_writes_for_every_kind_of_file(
    conn: asyncpg.Connection, kind: tuple[str, str, bool, bool]
) -> None:
    name, compression, media, split = kind
    await conn.execute(
        "UPDATE operations SET format = $1, compression = $2, media = $3, max_part_bytes = $4",
        name,
        compression,
        media,
        10 * 1024 * 1024 if split else None,
    )
    claimed = await claim(conn, "w1")
    extension = FileKind(name, compression, zipped=media).extension
    key = artifact_key(Settings(s3_prefix=S3_PREFIX), "op_1", 1, extension=extension, split=split)
    assert await artifact_rows(conn) == [(1, key, "WRITING")]
    assert claimed.request.file_kind.extension == extension


async def test_the_succeeded_call_publishes_its_own_file_from_writing_with_its_figures(
    conn: asyncpg.Connection,
) -> None:
    await add_member(conn)
    claimed = await claim(conn, "w1")
    assert await succeed_export(conn, claimed) is leases.SucceedOutcome.SUCCEEDED
    assert await conn.fetch("SELECT generation, state, size_bytes, sha256, message_count, parts FROM artifacts") == [
        (1, "PUBLISHED", 1, "s", 1, None)
    ]


async def test_an_adopting_succeeded_call_deletes_the_record_its_claim_made(conn: asyncpg.Connection) -> None:
    await add_member(conn)
    first = await claim(conn, "w1")
    await claims.verified_artifact(conn, first, files_of(1))
    await expire_lease(conn)
    second = await claim(conn, "w2")
    adopted = await leases.succeed_export(
        conn, claimed=second, files=files_of(1), artifact_generation=1, result_ttl_seconds=60
    )
    assert adopted is leases.SucceedOutcome.SUCCEEDED
    assert [(g, state) for g, _, state in await artifact_rows(conn)] == [(1, "PUBLISHED"), (2, "DELETED")]


async def test_an_earlier_generations_file_still_writing_is_never_published(conn: asyncpg.Connection) -> None:
    await add_member(conn)
    await claim(conn, "w1")
    await expire_lease(conn)
    second = await claim(conn, "w2")
    before = await row(conn)
    gone = await leases.succeed_export(
        conn, claimed=second, files=files_of(1), artifact_generation=1, result_ttl_seconds=60
    )
    assert gone is leases.SucceedOutcome.ARTIFACT_GONE
    assert await row(conn) == before
    assert [state for _, _, state in await artifact_rows(conn)] == ["WRITING", "WRITING"]
