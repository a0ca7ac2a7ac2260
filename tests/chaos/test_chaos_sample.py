"""The fault harness in the test run (docs/development.md: Development, The fault harness): a short fixed-seed sample of
rounds passes every check, and the checker finds each kind of damage a broken system would leave.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.faults import Injector
from tests.chaos.invariants import Checker, Deadlines, part_log_findings, read_messages
from tests.chaos.plan import ExportSpec, Fault, FaultKind, RoundPlan, ScheduleSpec
from tests.chaos.run import run_rounds
from tests.chaos.system import ChaosSystem, chaos_system
from tests.chaos.workload import Workload
from tests.support.chains import RUNS_SQL

pytestmark = pytest.mark.e2e

# Its three rounds kill the janitor and end its lock session, stop the relay and a worker, put an undecodable
# message on the queue, take the callback receiver down and cut S3 off, while seven schedules fire.
SAMPLE_SEED = 20261201
SAMPLE_ROUNDS = range(1, 4)
# The damage tests judge at once: nothing is left to settle in a system that is already quiet.
PROMPT = Deadlines(ended=30, outbox=5, queue=5, callbacks=10, orphans=1)
BAD_WAKEUP = Fault(FaultKind.BAD_WAKEUP, at_seconds=0.0, for_seconds=0.0)
# Round numbers of the damage tests' own conversations, apart from the sample's.
QUIET_ROUNDS = itertools.count(1000)
# A schedule firing every second for three seconds while four messages are sent, their first two alice's.
QUIET_SCHEDULE = ScheduleSpec("PT1S", "alice", 0.0, 5, {"format": "jsonl"}, 0, 3.0, 4, 0, None, 0.0)


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
    return await judged(system, RoundPlan(0, next(QUIET_ROUNDS), conversation_sizes=[5], exports=[export]))


async def scheduled_round(system: ChaosSystem) -> tuple[Workload, Checker, str]:
    """One schedule whose runs succeed without faults while messages are sent, a checker of it that has passed,
    and the schedule's id.
    """
    plan = RoundPlan(0, next(QUIET_ROUNDS), schedules=[QUIET_SCHEDULE])
    workload, checker = await judged(system, plan)
    [schedule_id] = workload.seen.scheduled
    assert checker.runs >= 2
    return workload, checker, schedule_id


async def judged(system: ChaosSystem, plan: RoundPlan) -> tuple[Workload, Checker]:
    """``plan`` run without faults, and a checker of it that has passed."""
    workload = Workload(system, plan, lambda _: None)
    await workload.prepare()
    before = await read_messages(system.database_url)
    await workload.run()
    await workload.close()
    await Injector(system, lambda _: None).heal()
    checker = Checker(system, workload.seen, before, PROMPT)
    assert await checker.check() == []
    return workload, checker


async def succeeded_again(system: ChaosSystem, *operation_ids: str) -> None:
    """Put operations a test damaged back as they were, so that later checks do not see their objects as
    orphans.
    """
    await system.faulty.pool.execute(
        "UPDATE operations SET state = 'SUCCEEDED', lease_expires_at = NULL WHERE operation_id = ANY($1)",
        list(operation_ids),
    )


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


async def test_the_checker_finds_a_stored_request_other_than_the_one_sent(system: ChaosSystem) -> None:
    workload, checker = await quiet_round(system)
    [operation_id] = workload.seen.submitted
    await system.faulty.pool.execute("UPDATE operations SET senders = '{bob}' WHERE operation_id = $1", operation_id)

    assert any("but the caller sent" in finding for finding in await checker.check())


async def test_the_checker_finds_a_message_outside_the_selection(system: ChaosSystem) -> None:
    workload, checker = await quiet_round(system)
    [operation_id] = workload.seen.submitted
    # The stored range now excludes seqs 1 and 5 (and the caller's request no longer matches it).
    await system.faulty.pool.execute(
        "UPDATE operations SET after_seq = 1, before_seq = 5 WHERE operation_id = $1", operation_id
    )
    findings = await checker.check()

    assert any("outside its selection: [1, 5]" in finding for finding in findings), findings


async def test_the_checker_finds_a_message_missing_or_twice(system: ChaosSystem) -> None:
    workload, checker = await quiet_round(system)
    [operation_id] = workload.seen.submitted
    key = await result_key(system, workload)
    stored = await (await system.faulty.s3.get_object(Bucket=checker.bucket, Key=key))["Body"].read()
    lines = stored.splitlines(keepends=True)
    changed = lines[0] + lines[0] + b"".join(lines[2:])  # the first message twice, the second missing
    await system.faulty.s3.put_object(Bucket=checker.bucket, Key=key, Body=changed)
    await system.faulty.pool.execute(
        "UPDATE operations SET result_size_bytes = $2, result_sha256 = $3 WHERE operation_id = $1",
        operation_id,
        len(changed),
        hashlib.sha256(changed).hexdigest(),
    )
    findings = await checker.check()

    assert any("a message is in its file twice" in finding for finding in findings), findings
    assert any("misses messages never recalled: [2]" in finding for finding in findings), findings


async def test_the_checker_finds_a_result_without_its_object(system: ChaosSystem) -> None:
    workload, checker = await quiet_round(system)
    await system.faulty.s3.delete_object(Bucket=checker.bucket, Key=await result_key(system, workload))

    assert any("SUCCEEDED without its object" in finding for finding in await checker.check())


async def test_the_checker_finds_an_operation_that_never_ends_or_is_parked_without_a_reason(
    system: ChaosSystem,
) -> None:
    first, checker = await quiet_round(system)
    second, parked = await quiet_round(system)
    [running], [repair] = first.seen.submitted, second.seen.submitted
    await system.faulty.pool.execute(
        "UPDATE operations SET state = 'RUNNING', lease_expires_at = now() + interval '1 hour' WHERE operation_id = $1",
        running,
    )
    await system.faulty.pool.execute(
        "UPDATE operations SET state = 'FAILED_REPAIR', error_code = NULL WHERE operation_id = $1", repair
    )
    impatient = Checker(system, first.seen, checker.before, replace(PROMPT, ended=1))

    assert any(f"{running} is RUNNING" in finding for finding in await impatient.check())
    assert any(f"{repair} parked in FAILED_REPAIR without a reason" in f for f in await parked.check())
    await succeeded_again(system, running, repair)


async def test_the_checker_finds_a_canceled_operation_that_left_its_object(system: ChaosSystem) -> None:
    workload, checker = await quiet_round(system)
    [operation_id] = workload.seen.submitted
    await system.faulty.pool.execute("UPDATE operations SET state = 'CANCELED' WHERE operation_id = $1", operation_id)

    assert any(f"{operation_id} CANCELED but left" in finding for finding in await checker.check())
    await succeeded_again(system, operation_id)


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


async def test_the_checker_finds_a_callback_never_received_or_under_another_id(system: ChaosSystem) -> None:
    workload, checker = await quiet_round(system)
    [operation_id] = workload.seen.submitted
    webhook_ids = system.receiver.received.pop(operation_id)

    assert any("callbacks" in finding and operation_id in finding for finding in await checker.check())
    system.receiver.received[operation_id] = webhook_ids | {"msg_another"}
    assert any("arrived with unknown ids ['msg_another']" in finding for finding in await checker.check())


async def test_the_checker_finds_an_outbox_row_left_unpublished(system: ChaosSystem) -> None:
    workload, checker = await quiet_round(system)
    [operation_id] = workload.seen.submitted
    group = system.faulty.system.group
    group.send("relay", signal.SIGSTOP)
    try:
        await system.faulty.pool.execute(
            "UPDATE outbox SET published_at = NULL WHERE outbox_id ="
            " (SELECT max(outbox_id) FROM outbox WHERE operation_id = $1)",
            operation_id,
        )
        findings = await checker.check()
    finally:
        group.send("relay", signal.SIGCONT)

    assert any("outbox rows unpublished" in finding for finding in findings), findings


async def test_the_checker_finds_answers_no_caller_should_get(system: ChaosSystem) -> None:
    workload, checker = await quiet_round(system)
    workload.seen.problems.append("GET /v3/operations/op_x answered 500")
    workload.seen.unavailable.append(time.monotonic())
    findings = await checker.check()

    assert "GET /v3/operations/op_x answered 500" in findings
    assert "a 503 answer while no fault was in place" in findings


async def test_the_checker_finds_an_object_no_record_names(system: ChaosSystem) -> None:
    _, checker = await quiet_round(system)
    janitor = system.faulty.system.group
    janitor.send("janitor", signal.SIGSTOP)  # the janitor would remove it after its grace
    try:
        orphan = f"{system.faulty.settings.s3_prefix}op_nobody/g1.jsonl"
        await system.faulty.s3.put_object(Bucket=checker.bucket, Key=orphan, Body=b"{}\n")
        findings = await checker.check()
        await system.faulty.s3.delete_object(Bucket=checker.bucket, Key=orphan)
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


async def chain_runs(system: ChaosSystem, schedule_id: str) -> list[Any]:
    """The schedule's runs that hold a message, by due time."""
    return await system.faulty.pool.fetch(
        "SELECT * FROM operations WHERE schedule_id = $1 AND result_message_count > 0 ORDER BY due_at", schedule_id
    )


async def test_the_checker_finds_a_chain_that_misses_a_message_or_ends_elsewhere_than_its_watermark(
    system: ChaosSystem,
) -> None:
    _, checker, schedule_id = await scheduled_round(system)
    pool = system.faulty.pool
    run = (await chain_runs(system, schedule_id))[-1]
    stored = await (await system.faulty.s3.get_object(Bucket=checker.bucket, Key=run["result_key"]))["Body"].read()
    first, rest = stored.split(b"\n", 1)
    await system.faulty.s3.put_object(Bucket=checker.bucket, Key=run["result_key"], Body=rest)
    await pool.execute(
        "UPDATE operations SET result_size_bytes = $2, result_sha256 = $3, result_message_count = $4"
        " WHERE operation_id = $1",
        run["operation_id"],
        len(rest),
        hashlib.sha256(rest).hexdigest(),
        run["result_message_count"] - 1,
    )
    await pool.execute("UPDATE export_schedules SET watermark = watermark + 1 WHERE schedule_id = $1", schedule_id)
    findings = await checker.check()

    missed = json.loads(first)["seq"]
    assert any(f"{schedule_id}: its chain's files miss messages never recalled: [{missed}]" in f for f in findings)
    assert any(f"{schedule_id}: its watermark is {run['snapshot_max_seq'] + 1}" in f for f in findings), findings


async def test_the_checker_finds_runs_at_once_and_a_run_not_keyed_by_its_latest_due_time(
    system: ChaosSystem,
) -> None:
    _, checker, schedule_id = await scheduled_round(system)
    first, second = (await system.faulty.pool.fetch(RUNS_SQL, schedule_id))[:2]
    # The second run now began with the first, at the first's due time.
    await system.faulty.pool.execute(
        "UPDATE operations SET created_at = $2 WHERE operation_id = $1", second["operation_id"], first["created_at"]
    )
    findings = await checker.check()

    assert f"run {second['operation_id']} of {schedule_id} was created before {first['operation_id']} ended" in findings
    assert f"run {second['operation_id']} of {schedule_id} is not keyed by its latest due time" in findings


async def test_the_checker_finds_two_runs_for_one_due_time(system: ChaosSystem) -> None:
    _, checker, schedule_id = await scheduled_round(system)
    first, second = (await system.faulty.pool.fetch(RUNS_SQL, schedule_id))[:2]
    pool = system.faulty.pool
    # What the unique constraint refuses, written without it: the checker must not rely on the database's rule.
    await pool.execute("ALTER TABLE operations DROP CONSTRAINT operations_schedule_due")
    try:
        await pool.execute("UPDATE operations SET due_at = $2 WHERE operation_id = $1", second[0], first["due_at"])
        findings = await checker.check()
    finally:
        await pool.execute("UPDATE operations SET due_at = $2 WHERE operation_id = $1", second[0], second["due_at"])
        await pool.execute("ALTER TABLE operations ADD CONSTRAINT operations_schedule_due UNIQUE (schedule_id, due_at)")

    twice = sorted([first["operation_id"], second["operation_id"]])
    assert f"{schedule_id} has runs {twice} for one due time {first['due_at']}" in findings, findings


def test_the_checker_finds_a_part_that_died_and_an_unhandled_error_in_the_round_s_logs(tmp_path: Path) -> None:
    earlier = 'Traceback (most recent call last):\n  File "x.py"\nValueError: before the round\n'
    (tmp_path / "api.log").write_text(earlier)
    (tmp_path / "worker-1.log").write_text(earlier)
    offsets = {tmp_path / "api.log": len(earlier), tmp_path / "worker-1.log": len(earlier)}
    with (tmp_path / "api.log").open("a") as api:
        api.write('{"level": "ERROR", "msg": "unhandled error", "exc": "Traceback (most recent call last):\\n"}\n')
    with (tmp_path / "relay.log").open("a") as relay:
        relay.write('{"level": "WARNING", "msg": "pool", "exc": "Traceback (most recent call last):\\n..."}\n')
        relay.write(
            "  + Exception Group Traceback (most recent call last):\n"
            "  | ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)\n"
            "    | asyncpg.exceptions._base.InternalClientError: cannot switch to state 15\n"
        )

    assert part_log_findings(tmp_path, offsets) == [
        "api logged 1 unhandled error(s)",
        "relay died of an uncaught error: asyncpg.exceptions._base.InternalClientError: cannot switch to state 15",
    ]
