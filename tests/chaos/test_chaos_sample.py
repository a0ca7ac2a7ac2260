"""The fault harness in the test run (README: Development, The fault harness): a short fixed-seed sample of
rounds passes every check, and the checker finds each kind of damage a broken system would leave.
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.chaos.faults import Injector
from tests.chaos.invariants import Checker, Deadlines, read_messages
from tests.chaos.plan import ExportSpec, Fault, FaultKind, RoundPlan
from tests.chaos.run import run_rounds
from tests.chaos.system import ChaosSystem, chaos_system
from tests.chaos.workload import Workload

pytestmark = pytest.mark.e2e

# Its three rounds stop both workers past their lease, kill the janitor, put an undecodable message on the
# queue and take the callback receiver down.
SAMPLE_SEED = 20261201
SAMPLE_ROUNDS = range(1, 4)
# The damage tests judge at once: nothing is left to settle in a system that is already quiet.
PROMPT = Deadlines(ended=30, outbox=5, queue=5, callbacks=10, orphans=1)
BAD_WAKEUP = Fault(FaultKind.BAD_WAKEUP, at_seconds=0.0, for_seconds=0.0)
# Round numbers of the damage tests' own conversations, apart from the sample's.
QUIET_ROUNDS = itertools.count(1000)


@pytest.fixture(scope="module")
async def system(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ChaosSystem]:
    async with chaos_system(tmp_path_factory.mktemp("chaos-system")) as started:
        yield started


async def test_a_fixed_seed_sample_of_rounds_passes_every_check(system: ChaosSystem, tmp_path: Path) -> None:
    summary = await run_rounds(system, SAMPLE_SEED, SAMPLE_ROUNDS, tmp_path)

    assert summary.violations == 0, (tmp_path / "rounds.jsonl").read_text()
    assert summary.rounds == len(SAMPLE_ROUNDS)
    assert summary.operations >= summary.rounds and sum(summary.faults.values()) >= summary.rounds


async def quiet_round(system: ChaosSystem) -> tuple[Workload, Checker]:
    """One export that succeeds without faults, and a checker of it that has passed."""
    export = ExportSpec("0", "alice", 0.0, {"format": "jsonl", "notify": {"url": "RECEIVER"}}, 0, None, 0, False, "")
    plan = RoundPlan(seed=0, round_number=next(QUIET_ROUNDS), conversation_sizes=[5], exports=[export])
    workload = Workload(system, plan, lambda _: None)
    await workload.prepare()
    before = await read_messages(system.database_url)
    await workload.run()
    await workload.close()
    await Injector(system, lambda _: None).heal()
    checker = Checker(system, workload.seen, before, PROMPT)
    assert await checker.check() == []
    return workload, checker


async def result_key(system: ChaosSystem, workload: Workload) -> str:
    [operation_id] = workload.seen.submitted
    key: str = await system.faulty.pool.fetchval(
        "SELECT result_key FROM operations WHERE operation_id = $1", operation_id
    )
    return key


async def test_the_checker_finds_a_stored_file_that_differs_from_its_record(system: ChaosSystem) -> None:
    workload, checker = await quiet_round(system)
    key = await result_key(system, workload)
    stored = await (await system.faulty.s3.get_object(Bucket=checker.bucket, Key=key))["Body"].read()
    await system.faulty.s3.put_object(Bucket=checker.bucket, Key=key, Body=stored.replace(b'"', b"'", 1))

    assert any("differs from its recorded size or sha256" in finding for finding in await checker.check())


async def test_the_checker_finds_a_message_outside_the_selection_or_missing(system: ChaosSystem) -> None:
    workload, checker = await quiet_round(system)
    [operation_id] = workload.seen.submitted
    await system.faulty.pool.execute(
        "UPDATE operations SET after_seq = 1, before_seq = 5 WHERE operation_id = $1", operation_id
    )
    findings = await checker.check()

    assert any("outside its selection: [1, 5]" in finding for finding in findings), findings


async def test_the_checker_finds_a_changed_message_and_a_second_operation_for_one_key(system: ChaosSystem) -> None:
    workload, checker = await quiet_round(system)
    [submitted] = workload.seen.submitted.values()
    await system.faulty.pool.execute(
        "UPDATE messages SET body = body || '!' WHERE conversation_id = $1 AND seq = 2", submitted.conversation_id
    )
    workload.seen.answers[(submitted.user, submitted.key)].add("op_another")
    findings = await checker.check()

    assert any("messages changed or lost" in finding for finding in findings), findings
    assert any(f"key {submitted.key} of alice answered" in finding for finding in findings), findings


async def test_the_checker_finds_a_callback_never_received(system: ChaosSystem) -> None:
    workload, checker = await quiet_round(system)
    [operation_id] = workload.seen.submitted
    system.receiver.received.pop(operation_id)

    assert any("callbacks" in finding and operation_id in finding for finding in await checker.check())


async def test_the_checker_finds_an_object_no_record_names(system: ChaosSystem) -> None:
    _, checker = await quiet_round(system)
    janitor = system.faulty.system.group
    janitor.send("janitor", signal.SIGSTOP)  # the janitor would remove it after its grace
    try:
        orphan = f"{system.faulty.settings.s3_prefix}op_nobody/g1.jsonl"
        await system.faulty.s3.put_object(Bucket=checker.bucket, Key=orphan, Body=b"{}\n")
        findings = await checker.check()
    finally:
        janitor.send("janitor", signal.SIGCONT)

    assert any("no live record names" in finding and orphan in finding for finding in findings), findings


async def test_the_checker_finds_messages_left_on_the_queue(system: ChaosSystem) -> None:
    _, checker = await quiet_round(system)
    group = system.faulty.system.group
    for worker in ("worker-1", "worker-2"):
        group.send(worker, signal.SIGSTOP)
    try:
        await Injector(system, lambda _: None).inject(BAD_WAKEUP)
        findings = await checker.check()
    finally:
        for worker in ("worker-1", "worker-2"):
            group.send(worker, signal.SIGCONT)

    assert any("the queue is not drained" in finding for finding in findings), findings
    assert await checker.check() == [], "the workers consumed the undecodable message once running again"
