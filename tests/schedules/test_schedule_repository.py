"""The schedules table on the real Postgres (docs/schedules.md: Scheduled exports): creation in the submit's key
space, firing at most once per due time, coalescing, and what a run's end does to its schedule.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest

from shared.export.cadence import Cadence
from shared.export.fingerprint import fingerprint, schedule_fingerprint
from shared.export.request import ExportRequest
from shared.ids import new_operation_id, new_schedule_id
from shared.repository import schedule_runs, schedules
from shared.repository.message_store import put_members
from shared.repository.schedule_runs import FireOutcome
from shared.repository.schedules import ResumeOutcome
from shared.repository.submissions import SubmitOutcome, submit_export
from shared.states import PauseReason, ScheduleState, WaitingReason
from tests.support import wait_for

pytestmark = pytest.mark.module_database


async def create(
    conn: asyncpg.Connection,
    key: str = "k1",
    *,
    every: str = "PT1S",
    mode: str = "incremental",
    request: ExportRequest | None = None,
    max_schedules: int = 20,
    owner: str = "alice",
) -> str | None:
    result = await schedules.create_schedule(
        conn,
        schedule_id=new_schedule_id(),
        owner_id=owner,
        conversation_id="c-a",
        idempotency_key=key,
        fingerprint=f"fp-{every}-{mode}",
        every=Cadence.parse(every),
        start_at=None,
        mode=mode,
        request=request or ExportRequest(notify_url="http://127.0.0.1:9/cb"),
        replay_window_seconds=3600,
        max_schedules=max_schedules,
    )
    return result.schedule_id if result.outcome is SubmitOutcome.CREATED else result.outcome.value


async def fire(conn: asyncpg.Connection, schedule_id: str, *, max_active: int = 5) -> schedule_runs.FireResult:
    return await schedule_runs.fire(
        conn, schedule_id=schedule_id, operation_id=new_operation_id(), max_active=max_active
    )


@pytest.fixture
async def conn(pool: asyncpg.Pool) -> asyncpg.Connection:
    async with pool.acquire() as connection:
        await put_members(connection, conversation_id="c-a", members=["alice", "bob"])
        yield connection


async def ten_seconds_pass(conn: asyncpg.Connection) -> None:
    """Move the schedules and their runs ten seconds back, as if that much time had passed."""
    await conn.execute(
        "UPDATE export_schedules SET start_at = start_at - interval '10 s', next_run_at = next_run_at - interval '10 s'"
    )
    await conn.execute("UPDATE operations SET due_at = due_at - interval '10 s' WHERE schedule_id IS NOT NULL")


async def runs(conn: asyncpg.Connection, schedule_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT operation_id, due_at, after_seq, state FROM operations WHERE schedule_id = $1 ORDER BY due_at",
        schedule_id,
    )


async def test_keys_are_shared_with_submits_and_replays_return_the_schedule(conn: asyncpg.Connection) -> None:
    schedule_id = await create(conn, "k1")
    assert schedule_id is not None and schedule_id.startswith("sch_")
    replay = await schedules.create_schedule(
        conn,
        schedule_id=new_schedule_id(),
        owner_id="alice",
        conversation_id="c-a",
        idempotency_key="k1",
        fingerprint="fp-PT1S-incremental",
        every=Cadence.parse("PT1S"),
        start_at=None,
        mode="incremental",
        request=ExportRequest(),
        replay_window_seconds=3600,
        max_schedules=20,
    )
    assert (replay.outcome, replay.schedule_id) == (SubmitOutcome.REPLAYED, schedule_id)
    assert await create(conn, "k1", every="PT2S") == "reused"
    # The fingerprints of a schedule and an export never match, so a key names one kind only.
    request = ExportRequest()
    as_export = fingerprint(user_id="alice", conversation_id="c-a", request=request)
    as_schedule = schedule_fingerprint(
        user_id="alice", conversation_id="c-a", request=request, every="PT1S", start_at=None, mode="incremental"
    )
    assert as_export != as_schedule
    submitted = await submit_export(
        conn,
        operation_id=new_operation_id(),
        owner_id="alice",
        conversation_id="c-a",
        idempotency_key="k1",
        fingerprint=as_export,
        request=request,
        replay_window_seconds=3600,
        max_active=5,
        limits=None,
    )
    assert submitted.outcome is SubmitOutcome.REUSED
    await submit_export(
        conn,
        operation_id=new_operation_id(),
        owner_id="alice",
        conversation_id="c-a",
        idempotency_key="k2",
        fingerprint="fp-PT1S-incremental",
        request=ExportRequest(),
        replay_window_seconds=3600,
        max_active=5,
        limits=None,
    )
    assert await create(conn, "k2") == "reused"
    assert await create(conn, "k3", owner="carol") == "not_member"
    assert await create(conn, "k4", max_schedules=1) == "quota"


async def test_a_run_is_created_once_per_due_time_and_waits_while_one_is_unfinished(conn: asyncpg.Connection) -> None:
    schedule_id = await create(conn)
    assert schedule_id is not None
    first = await fire(conn, schedule_id)
    assert first.outcome is FireOutcome.CREATED
    assert (await fire(conn, schedule_id)).outcome is FireOutcome.NOT_DUE
    await ten_seconds_pass(conn)
    assert (await fire(conn, schedule_id)).outcome is FireOutcome.NOT_DUE
    assert await schedule_runs.due_schedules(conn, limit=10) == []
    await conn.execute(
        "UPDATE operations SET state = 'FAILED', finished_at = now() WHERE schedule_id = $1", schedule_id
    )
    [due] = await schedule_runs.due_schedules(conn, limit=10)
    assert due.schedule_id == schedule_id
    assert await schedule_runs.due_schedules(conn, limit=10, after=due) == [], "the page after the last is empty"
    second = await fire(conn, schedule_id)
    assert second.outcome is FireOutcome.CREATED
    [a, b] = await runs(conn, schedule_id)
    assert a["due_at"] < b["due_at"] and b["state"] == "QUEUED"
    assert await conn.fetchval("SELECT count(*) FROM outbox WHERE operation_id = $1", second.operation_id) == 1
    view = await schedules.read_schedule(conn, schedule_id=schedule_id, owner_id="alice")
    assert view is not None and view.last_operation_id == second.operation_id and view.last_run_state == "QUEUED"
    assert view.next_run_at is not None and view.next_run_at > b["due_at"]


async def test_ten_missed_due_times_become_one_run_keyed_by_the_latest(conn: asyncpg.Connection) -> None:
    schedule_id = await create(conn, every="PT1M")
    assert schedule_id is not None
    await conn.execute("UPDATE export_schedules SET start_at = now() - interval '10 min 30 s', next_run_at = start_at")
    fired = await fire(conn, schedule_id)
    assert fired.outcome is FireOutcome.CREATED
    [run] = await runs(conn, schedule_id)
    start = await conn.fetchval("SELECT start_at FROM export_schedules")
    assert run["due_at"] == start + timedelta(minutes=10)


async def test_concurrent_fires_create_one_run_and_a_stale_due_time_is_refused(
    pool: asyncpg.Pool, conn: asyncpg.Connection
) -> None:
    schedule_id = await create(conn)
    assert schedule_id is not None

    async def one() -> FireOutcome:
        async with pool.acquire() as other:
            return (await fire(other, schedule_id)).outcome

    outcomes = await asyncio.gather(*(one() for _ in range(6)))
    assert sorted(outcomes).count(FireOutcome.CREATED) == 1
    [run] = await runs(conn, schedule_id)
    await conn.execute("UPDATE operations SET state = 'SUCCEEDED' WHERE schedule_id = $1", schedule_id)
    # A firing part that computed this due time before it froze finds the run there.
    await conn.execute("UPDATE export_schedules SET next_run_at = now() - interval '1 s', start_at = $1", run["due_at"])
    await conn.execute("UPDATE export_schedules SET every = 'P1D'")
    assert (await fire(conn, schedule_id)).outcome is FireOutcome.DUPLICATE
    assert len(await runs(conn, schedule_id)) == 1


async def test_a_fire_that_waited_for_another_sees_its_run_and_leaves_the_due_time_waiting(
    pool: asyncpg.Pool, conn: asyncpg.Connection
) -> None:
    schedule_id = await create(conn)
    assert schedule_id is not None
    async with pool.acquire() as first, pool.acquire() as second:
        held = first.transaction()
        await held.start()
        try:
            # The first fire's run is written, its lock held until the commit below.
            assert (await fire(first, schedule_id)).outcome is FireOutcome.CREATED
            next_due = await first.fetchval(
                "SELECT next_run_at FROM export_schedules WHERE schedule_id = $1", schedule_id
            )
            # The next due time passes before the second fire begins, so the schedule row it waits for is due.
            await wait_for(lambda: second.fetchval("SELECT clock_timestamp() > $1", next_due), timeout=10)
            waiting = asyncio.create_task(fire(second, schedule_id))
            blocked_pid = second.get_server_pid()
            await wait_for(lambda: _waits_for_a_lock(conn, blocked_pid), timeout=10)
        finally:
            await held.commit()
        assert (await waiting).outcome is FireOutcome.NOT_DUE
    assert len(await runs(conn, schedule_id)) == 1


async def _waits_for_a_lock(conn: asyncpg.Connection, pid: int) -> bool:
    waiting: bool = await conn.fetchval(
        "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", pid
    )
    return waiting


async def test_the_watermark_moves_only_from_the_run_that_started_at_it(conn: asyncpg.Connection) -> None:
    schedule_id = await create(conn, request=ExportRequest(after_seq=5))
    assert schedule_id is not None
    first = await fire(conn, schedule_id)
    [run] = await runs(conn, schedule_id)
    assert run["after_seq"] == 5
    await conn.execute(
        "UPDATE operations SET snapshot_max_seq = 12, state = 'SUCCEEDED' WHERE operation_id = $1", first.operation_id
    )
    assert await conn.fetchval("SELECT watermark FROM export_schedules") == 12
    # A run that did not start at the watermark (an old one repaired late) cannot move it.
    await conn.execute("UPDATE operations SET state = 'RUNNING' WHERE operation_id = $1", first.operation_id)
    await conn.execute("UPDATE export_schedules SET watermark = 20")
    await conn.execute(
        "UPDATE operations SET snapshot_max_seq = 30, state = 'SUCCEEDED' WHERE operation_id = $1", first.operation_id
    )
    assert await conn.fetchval("SELECT watermark FROM export_schedules") == 20
    await ten_seconds_pass(conn)
    second = await fire(conn, schedule_id)
    assert await conn.fetchval("SELECT after_seq FROM operations WHERE operation_id = $1", second.operation_id) == 20


async def test_a_run_in_repair_pauses_the_schedule_until_it_is_requeued(conn: asyncpg.Connection) -> None:
    schedule_id = await create(conn)
    assert schedule_id is not None
    fired = await fire(conn, schedule_id)
    await conn.execute("UPDATE operations SET state = 'FAILED_REPAIR' WHERE operation_id = $1", fired.operation_id)
    view = await schedules.read_schedule(conn, schedule_id=schedule_id, owner_id="alice")
    assert view is not None and (view.state, view.paused_reason) == (ScheduleState.PAUSED, PauseReason.RUN_NEEDS_REPAIR)
    assert (
        await schedules.resume(conn, schedule_id=schedule_id, owner_id="alice")
    ).outcome is ResumeOutcome.NEEDS_REPAIR
    assert await conn.fetchval("SELECT event_type FROM webhook_deliveries WHERE schedule_id = $1", schedule_id) == (
        "schedule.paused"
    )
    await conn.execute("UPDATE operations SET state = 'QUEUED' WHERE operation_id = $1", fired.operation_id)
    view = await schedules.read_schedule(conn, schedule_id=schedule_id, owner_id="alice")
    assert view is not None and view.state is ScheduleState.ACTIVE


async def test_the_owners_pause_during_a_repair_outlasts_the_repair(conn: asyncpg.Connection) -> None:
    schedule_id = await create(conn)
    assert schedule_id is not None
    fired = await fire(conn, schedule_id)
    await conn.execute("UPDATE operations SET state = 'FAILED_REPAIR' WHERE operation_id = $1", fired.operation_id)
    paused = await schedules.pause(conn, schedule_id=schedule_id, owner_id="alice")
    assert paused is not None and paused.paused_reason is PauseReason.USER
    await conn.execute("UPDATE operations SET state = 'QUEUED' WHERE operation_id = $1", fired.operation_id)
    view = await schedules.read_schedule(conn, schedule_id=schedule_id, owner_id="alice")
    assert view is not None and (view.state, view.paused_reason) == (ScheduleState.PAUSED, PauseReason.USER)
    assert view.next_run_at is None
    resumed = await schedules.resume(conn, schedule_id=schedule_id, owner_id="alice")
    assert resumed.outcome is ResumeOutcome.RESUMED


async def test_a_revoked_member_pauses_the_schedule_and_no_run_is_created(conn: asyncpg.Connection) -> None:
    schedule_id = await create(conn)
    assert schedule_id is not None
    await put_members(conn, conversation_id="c-a", members=["bob"])
    assert (await fire(conn, schedule_id)).outcome is FireOutcome.ACCESS_REVOKED
    assert await runs(conn, schedule_id) == []
    view = await schedules.read_schedule(conn, schedule_id=schedule_id, owner_id="alice")
    assert view is not None and view.paused_reason is PauseReason.ACCESS_REVOKED and view.next_run_at is None
    kept = await schedules.pause(conn, schedule_id=schedule_id, owner_id="alice")
    assert kept is not None and kept.paused_reason is PauseReason.ACCESS_REVOKED
    assert (await schedules.resume(conn, schedule_id=schedule_id, owner_id="alice")).outcome is ResumeOutcome.NOT_MEMBER
    await put_members(conn, conversation_id="c-a", members=["alice", "bob"])
    resumed = await schedules.resume(conn, schedule_id=schedule_id, owner_id="alice")
    assert resumed.outcome is ResumeOutcome.RESUMED and resumed.schedule is not None
    assert resumed.schedule.state is ScheduleState.ACTIVE


async def test_at_the_quota_the_run_waits_and_is_created_once_a_slot_frees(conn: asyncpg.Connection) -> None:
    schedule_id = await create(conn)
    assert schedule_id is not None
    held = new_operation_id()
    await submit_export(
        conn,
        operation_id=held,
        owner_id="alice",
        conversation_id="c-a",
        idempotency_key="busy",
        fingerprint="x",
        request=ExportRequest(),
        replay_window_seconds=3600,
        max_active=5,
        limits=None,
    )
    assert (await fire(conn, schedule_id, max_active=1)).outcome is FireOutcome.WAITING_FOR_QUOTA
    view = await schedules.read_schedule(conn, schedule_id=schedule_id, owner_id="alice")
    assert view is not None and view.waiting_reason is WaitingReason.ACTIVE_EXPORT_QUOTA
    await conn.execute("UPDATE operations SET state = 'CANCELED' WHERE operation_id = $1", held)
    assert (await fire(conn, schedule_id, max_active=1)).outcome is FireOutcome.CREATED
    view = await schedules.read_schedule(conn, schedule_id=schedule_id, owner_id="alice")
    assert view is not None and view.waiting_reason is None


async def test_pause_resume_and_delete_are_the_owners_only(conn: asyncpg.Connection) -> None:
    schedule_id = await create(conn, every="P1D")
    assert schedule_id is not None
    assert await schedules.pause(conn, schedule_id=schedule_id, owner_id="bob") is None
    paused = await schedules.pause(conn, schedule_id=schedule_id, owner_id="alice")
    again = await schedules.pause(conn, schedule_id=schedule_id, owner_id="alice")
    assert paused is not None and again is not None and paused.version == again.version
    assert paused.paused_reason is PauseReason.USER
    resumed = await schedules.resume(conn, schedule_id=schedule_id, owner_id="alice")
    assert resumed.schedule is not None and resumed.schedule.next_run_at is not None
    assert resumed.schedule.next_run_at == resumed.schedule.start_at + timedelta(days=1)
    assert not await schedules.delete(conn, schedule_id=schedule_id, owner_id="bob")
    assert await schedules.delete(conn, schedule_id=schedule_id, owner_id="alice")
    assert await schedules.read_schedule(conn, schedule_id=schedule_id, owner_id="alice") is None
