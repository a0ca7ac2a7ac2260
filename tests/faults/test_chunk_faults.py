"""Chunked exports under faults, on real processes (docs/chunks.md: Chunked exports): a worker killed while it
writes a chunk or while it assembles costs at most what it held, a cancel and a revocation reach every chunk,
and an ended export leaves nothing but its file.

S3 is reached through a throttled proxy so that each chunk's upload lasts a while: long enough to act in the
middle of the export, whatever the machine's speed.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.support import wait_for
from tests.support.fault_harness import (
    BIG_MEMBERS,
    MIB,
    SLOW_UPLOADS,
    Faulty,
    big_conversation_system,
    check_ended_correctly,
    ready_for_the_next_test,
    uploading,
)

# About 15 chunks of 1 MiB, two running at once, each of them seconds long at this rate.
CHUNKED = {
    "CHATEXPORT_CHUNK_THRESHOLD_BYTES": str(MIB),
    "CHATEXPORT_CHUNK_TARGET_BYTES": str(MIB),
    "CHATEXPORT_CHUNKS_PER_EXPORT": "2",
}
CHUNK_BYTES_PER_SECOND = 512 * 1024


@pytest.fixture(scope="module")
async def faulty(template_db: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Faulty]:
    """One system for the module's tests, chunking anything above 1 MiB; ``c-big`` (about 15 MB of messages)
    with alice and bob.
    """
    log_dir = tmp_path_factory.mktemp("chunk-faults")
    async with big_conversation_system(template_db, log_dir, {**SLOW_UPLOADS, **CHUNKED}) as system:
        yield system


@pytest.fixture(autouse=True)
async def _ready_for_the_next_test(faulty: Faulty) -> AsyncIterator[None]:
    yield
    await ready_for_the_next_test(faulty, BIG_MEMBERS)


async def chunks(faulty: Faulty, operation_id: str) -> list[asyncpg.Record]:
    return await faulty.pool.fetch(
        "SELECT chunk_no, state, generation, lease_owner FROM export_chunks WHERE operation_id = $1 ORDER BY chunk_no",
        operation_id,
    )


async def some_done_and_one_held(faulty: Faulty, operation_id: str) -> list[asyncpg.Record]:
    """Wait until at least one chunk is DONE and another is held by a worker; return the chunks then."""

    async def reached() -> list[asyncpg.Record] | None:
        now = await chunks(faulty, operation_id)
        states = {chunk["state"] for chunk in now}
        return now if "DONE" in states and "RUNNING" in states else None

    result: list[asyncpg.Record] = await wait_for(reached, timeout=60)
    return result


async def start(
    faulty: Faulty, key: str, user: str = "alice", *, bytes_per_second: float = CHUNK_BYTES_PER_SECOND
) -> tuple[str, bytes, str]:
    fingerprint = await faulty.messages_fingerprint()
    expected = await faulty.expected(user, "c-big")
    faulty.proxy.throttle(bytes_per_second)
    return await faulty.submit(user, "c-big", key), expected, fingerprint


async def test_a_worker_killed_mid_chunk_costs_only_the_chunks_it_held(faulty: Faulty) -> None:
    operation_id, expected, fingerprint = await start(faulty, "chunk-kill")
    before = await some_done_and_one_held(faulty, operation_id)
    victim = faulty.system.holder(next(chunk["lease_owner"] for chunk in before if chunk["state"] == "RUNNING"))
    assert faulty.system.group.kill(victim) == -signal.SIGKILL
    faulty.proxy.throttle(None)

    await check_ended_correctly(faulty, "alice", {operation_id: expected}, fingerprint=fingerprint)
    after = {chunk["chunk_no"]: chunk for chunk in await chunks(faulty, operation_id)}
    # A chunk finished before the kill was never written again; only those the victim held ran twice.
    for chunk in before:
        if chunk["state"] == "DONE":
            assert after[chunk["chunk_no"]]["generation"] == chunk["generation"]
    redone = [number for number, chunk in after.items() if chunk["generation"] > 1]
    assert len(redone) <= 2, redone


async def test_a_worker_killed_while_it_assembles_is_taken_over_without_redoing_a_chunk(faulty: Faulty) -> None:
    # Faster: every chunk is written, and read by the assembly, before the moment this test needs.
    operation_id, expected, fingerprint = await start(faulty, "assembly-kill", bytes_per_second=4 * MIB)
    await uploading(faulty, operation_id)  # the assembly's upload is recorded before its first part
    before = await wait_for(lambda: _all_done_while_running(faulty, operation_id), timeout=120)
    holder = faulty.system.holder((await faulty.operation(operation_id))["lease_owner"])
    assert faulty.system.group.kill(holder) == -signal.SIGKILL
    faulty.proxy.throttle(None)

    await check_ended_correctly(faulty, "alice", {operation_id: expected}, fingerprint=fingerprint)
    assert (await faulty.operation(operation_id))["generation"] >= 2
    assert [chunk["generation"] for chunk in await chunks(faulty, operation_id)] == [
        chunk["generation"] for chunk in before
    ]


async def _all_done_while_running(faulty: Faulty, operation_id: str) -> list[asyncpg.Record] | None:
    """Every chunk DONE while the export is still RUNNING (its last parts being assembled): the chunks."""
    now = await chunks(faulty, operation_id)
    running = (await faulty.operation(operation_id))["state"] == "RUNNING"
    return now if running and {chunk["state"] for chunk in now} == {"DONE"} else None


async def test_a_cancel_reaches_every_chunk_and_removes_every_object(faulty: Faulty) -> None:
    operation_id, _, fingerprint = await start(faulty, "chunk-cancel")
    await some_done_and_one_held(faulty, operation_id)
    response = await faulty.http.post(f"/v3/operations/{operation_id}/cancel", headers=faulty.auth("alice"))
    assert response.status == 202, await response.text()
    faulty.proxy.throttle(None)

    await check_ended_correctly(faulty, "alice", {operation_id: "CANCELED"}, fingerprint=fingerprint)
    # Each holder let go at its next fenced write.
    await wait_for(lambda: _none_held(faulty, operation_id), timeout=30)


async def _none_held(faulty: Faulty, operation_id: str) -> bool:
    return all(chunk["lease_owner"] is None for chunk in await chunks(faulty, operation_id))


async def test_membership_removed_mid_export_fails_it_with_access_revoked(faulty: Faulty) -> None:
    operation_id, _, fingerprint = await start(faulty, "chunk-revoke", user="bob")
    await some_done_and_one_held(faulty, operation_id)
    removed = await faulty.http.delete(
        "/admin/conversations/c-big/members/bob", headers=faulty.auth("root", admin=True)
    )
    assert removed.status == 204, await removed.text()
    faulty.proxy.throttle(None)

    await check_ended_correctly(faulty, "bob", {operation_id: "FAILED"}, fingerprint=fingerprint)
    assert (await faulty.operation(operation_id))["error_code"] == "ACCESS_REVOKED"


async def test_the_check_between_tests_finds_a_fault_left_on(faulty: Faulty) -> None:
    faulty.proxy.throttle(CHUNK_BYTES_PER_SECOND)
    try:
        with pytest.raises(AssertionError, match="throttled"):
            await ready_for_the_next_test(faulty, BIG_MEMBERS)
    finally:
        faulty.proxy.throttle(None)
    faulty.system.group.send("worker-1", signal.SIGSTOP)
    try:
        await wait_for(lambda: faulty.system.group.stopped() == ["worker-1"], timeout=10)
        with pytest.raises(AssertionError, match="worker-1"):
            await ready_for_the_next_test(faulty, BIG_MEMBERS)
    finally:
        faulty.system.group.send("worker-1", signal.SIGCONT)
