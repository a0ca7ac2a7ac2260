"""Workers killed, frozen and refused mid-export, and a frozen janitor leader, on real processes (docs/states.md:
States and failure model; How it works).

S3 is reached through a throttled proxy so that an upload of a few MiB lasts seconds: long enough to act
in its middle, whatever the machine's speed.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from tests.support import wait_for
from tests.support.fault_harness import (
    BIG_MEMBERS,
    MIB,
    SLOW_UPLOADS,
    UPLOAD_BYTES_PER_SECOND,
    Faulty,
    big_conversation_system,
    check_ended_correctly,
    ready_for_the_next_test,
    uploading,
)

pytestmark = pytest.mark.e2e

STALE_WRITES = "chatexport_worker_stale_generation_writes_total{"


@pytest.fixture(scope="module")
async def faulty(
    template_db: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> AsyncIterator[Faulty]:
    """One system for the module's tests (one more for each set of settings a test parametrized indirectly
    passes); ``c-big`` (about 15 MB of messages) with alice and bob.
    """
    log_dir = tmp_path_factory.mktemp("worker-faults")
    async with big_conversation_system(
        template_db, log_dir, {**SLOW_UPLOADS, **getattr(request, "param", {})}
    ) as system:
        yield system


@pytest.fixture(autouse=True)
async def _ready_for_the_next_test(faulty: Faulty) -> AsyncIterator[None]:
    yield
    await ready_for_the_next_test(faulty, BIG_MEMBERS)


@dataclass(frozen=True)
class SlowExport:
    """An export of ``c-big`` by alice caught in its first upload, with what it must end up publishing."""

    operation_id: str
    holder: str  # the part running it
    expected: bytes
    fingerprint: str

    async def check(self, faulty: Faulty) -> None:
        """The invariants, with this export SUCCEEDED."""
        await check_ended_correctly(faulty, "alice", {self.operation_id: self.expected}, fingerprint=self.fingerprint)


async def slow_export_in_upload(faulty: Faulty, key: str, *, bytes_per_second: float) -> SlowExport:
    """Throttle S3 to ``bytes_per_second``, submit, and wait until the first part is being uploaded."""
    fingerprint = await faulty.messages_fingerprint()
    expected = await faulty.expected("alice", "c-big")
    faulty.proxy.throttle(bytes_per_second)
    operation_id = await faulty.submit("alice", "c-big", key)
    holder = await uploading(faulty, operation_id)
    return SlowExport(operation_id, holder, expected, fingerprint)


async def test_a_worker_killed_mid_upload_is_taken_over_and_the_export_succeeds_once(faulty: Faulty) -> None:
    export = await slow_export_in_upload(faulty, "kill-1", bytes_per_second=UPLOAD_BYTES_PER_SECOND)
    operation_id = export.operation_id
    survivors = [name for name in faulty.system.metrics_ports if name.startswith("worker") and name != export.holder]
    takeovers_before = await takeovers(faulty, survivors)
    assert faulty.system.group.kill(export.holder) == -signal.SIGKILL
    faulty.proxy.throttle(None)

    await export.check(faulty)
    row = await faulty.operation(operation_id)
    generation = row["generation"]
    assert generation >= 2 and row["attempt"] == generation
    # Each generation after the first took the lease over from a dead holder, and says so in its metrics.
    assert await takeovers(faulty, survivors) == takeovers_before + generation - 1
    assert row["result_key"].endswith(f"/g{generation}.jsonl")
    artifacts = await faulty.pool.fetch(
        "SELECT generation, state FROM artifacts WHERE operation_id = $1 ORDER BY generation", operation_id
    )
    assert [tuple(artifact) for artifact in artifacts] == [
        (number, "PUBLISHED" if number == generation else "DELETED") for number in range(1, generation + 1)
    ]


async def test_a_frozen_holder_is_fenced_out_when_it_wakes_up(faulty: Faulty) -> None:
    export = await slow_export_in_upload(faulty, "freeze-1", bytes_per_second=UPLOAD_BYTES_PER_SECOND)
    operation_id, holder = export.operation_id, export.holder
    stale_before = await stale_writes(faulty, holder)
    faulty.system.group.send(holder, signal.SIGSTOP)
    try:
        # The frozen worker sends no heartbeat: its lease expires and another worker takes over.
        await wait_for(lambda: _generation_at_least(faulty, operation_id, 2), timeout=60)
        faulty.proxy.throttle(None)
        await faulty.wait_state(operation_id, "SUCCEEDED")
    finally:
        faulty.system.group.send(holder, signal.SIGCONT)

    # Woken up, the old holder's next write is refused by its generation, and it says so.
    rejected = faulty.system.group.wait_for_line(
        holder, lambda line: "a newer generation holds the operation" in line and operation_id in line, timeout=60
    )
    assert '"generation": 1' in rejected
    assert await stale_writes(faulty, holder) >= stale_before + 1
    await export.check(faulty)
    row = await faulty.operation(operation_id)
    assert row["result_key"].endswith("/g2.jsonl")
    assert row["generation"] == 2


async def test_membership_removed_during_a_run_fails_it_with_access_revoked_and_no_object(faulty: Faulty) -> None:
    fingerprint = await faulty.messages_fingerprint()
    faulty.proxy.throttle(UPLOAD_BYTES_PER_SECOND)
    operation_id = await faulty.submit("bob", "c-big", "revoke-1")

    await uploading(faulty, operation_id)
    removed = await faulty.http.delete(
        "/admin/conversations/c-big/members/bob", headers=faulty.auth("root", admin=True)
    )
    assert removed.status == 204
    faulty.proxy.throttle(None)

    await check_ended_correctly(faulty, "bob", {operation_id: "FAILED"}, fingerprint=fingerprint)
    row = await faulty.operation(operation_id)
    assert row["error_code"] == "ACCESS_REVOKED"
    assert row["result_key"] is None


async def test_a_message_recalled_before_the_attempt_reads_it_is_not_in_the_file(faulty: Faulty) -> None:
    faulty.proxy.throttle(UPLOAD_BYTES_PER_SECOND)
    operation_id = await faulty.submit("alice", "c-big", "recall-1")

    # The attempt reads seq ranges in order, at most two parts ahead of the upload: the last message is
    # unread while the first part uploads, and stays so while its worker is frozen.
    holder = await uploading(faulty, operation_id)
    faulty.system.group.send(holder, signal.SIGSTOP)
    try:
        recalled = await faulty.http.delete("/v2/conversations/c-big/messages/m39999", headers=faulty.auth("alice"))
        assert recalled.status == 200
    finally:
        faulty.system.group.send(holder, signal.SIGCONT)
    faulty.proxy.throttle(None)

    fingerprint = await faulty.messages_fingerprint()
    expected = await faulty.expected("alice", "c-big")
    assert b'"message_id":"m39999"' not in expected
    await check_ended_correctly(faulty, "alice", {operation_id: expected}, fingerprint=fingerprint)


async def test_a_stopped_worker_hands_its_export_back_and_another_takes_it_over(faulty: Faulty) -> None:
    # Slow enough that the export cannot finish within the shutdown grace period.
    export = await slow_export_in_upload(faulty, "stop-1", bytes_per_second=MIB)
    assert faulty.system.group.stop(export.holder, signal.SIGTERM, timeout=30) == 0
    row = await faulty.operation(export.operation_id)
    assert row["generation"] == 2 or row["progress_phase"] == "handed back", dict(row)
    faulty.proxy.throttle(None)

    await export.check(faulty)
    row = await faulty.operation(export.operation_id)
    # The handed-back attempt is not counted against the budget.
    assert row["generation"] >= 2 and row["attempt"] == row["generation"] - 1


async def test_a_frozen_janitor_leader_loses_the_lead_and_work_goes_on(faulty: Faulty) -> None:
    faulty.system.start_part("janitor", name="janitor-2")
    faulty.system.group.wait_for_line("janitor", lambda line: "janitor leads" in line, timeout=30)
    faulty.system.group.send("janitor", signal.SIGSTOP)
    try:
        # A crashed export now needs a janitor to wake it up again: only the standby can.
        export = await slow_export_in_upload(faulty, "janitor-1", bytes_per_second=UPLOAD_BYTES_PER_SECOND)
        faulty.system.group.kill(export.holder)
        faulty.proxy.throttle(None)
        faulty.system.group.wait_for_line("janitor-2", lambda line: "janitor leads" in line, timeout=60)
        await faulty.wait_state(export.operation_id, "SUCCEEDED")
        assert (await faulty.metrics("janitor-2"))["chatexport_janitor_leader{}"] == 1
    finally:
        faulty.system.group.send("janitor", signal.SIGCONT)
    await export.check(faulty)


# Last in the file: its settings need a system of their own, started once the other tests are done.
@pytest.mark.parametrize("faulty", [{"CHATEXPORT_JANITOR_REQUEUE_AFTER_SECONDS": "3600"}], indirect=True)
async def test_a_killed_holder_is_taken_over_at_the_first_janitor_pass_after_its_lease(faulty: Faulty) -> None:
    # The wake-up that started the attempt was published seconds ago, well within the hour that the
    # janitor waits after a wake-up before it sends another: only the lease's expiry may count here.
    export = await slow_export_in_upload(faulty, "kill-2", bytes_per_second=UPLOAD_BYTES_PER_SECOND)
    assert faulty.system.group.kill(export.holder) == -signal.SIGKILL
    faulty.proxy.throttle(None)
    settings = faulty.settings
    # lease + one janitor interval, plus the relay's and a worker's turn (docs/states.md: States and failure model).
    deadline = settings.lease_seconds + settings.janitor_interval_seconds + 10
    await wait_for(lambda: _generation_at_least(faulty, export.operation_id, 2), timeout=deadline)
    await export.check(faulty)


async def stale_writes(faulty: Faulty, worker: str) -> float:
    """Writes refused by a newer generation, as ``worker`` counts them."""
    figures = await faulty.metrics(worker)
    return sum(value for key, value in figures.items() if key.startswith(STALE_WRITES))


async def takeovers(faulty: Faulty, workers: list[str]) -> float:
    """Lease takeovers counted by ``workers`` together."""
    return sum([(await faulty.metrics(name))["chatexport_worker_lease_takeovers_total{}"] for name in workers])


async def _generation_at_least(faulty: Faulty, operation_id: str, generation: int) -> bool:
    row = await faulty.operation(operation_id)
    return bool(row["generation"] >= generation)
