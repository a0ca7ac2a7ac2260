"""The scheduler on the real Postgres, in the test's event loop and as real janitor processes (docs/schedules.md:
Who fires them): due times coalesced while a run is unfinished or nobody fired, no duplicate run whoever fires
at once or dies while firing, a revoked member's schedule paused with its callback, a run that waits at the
quota, and the next due time after a resume.

Time passes by moving a schedule's times back (``time_passes``), as the repository's tests do, by whole steps of a
ten-second interval, so that no due time comes on its own while a test runs; where a janitor process or the
pipeline fires, time is the real clock's and the interval the test-only minimum, a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from prometheus_client import REGISTRY

from devtools.broker import delete_broker_objects
from devtools.localsystem import MOTO_CREDENTIALS, LocalSystem
from devtools.moto import MotoServer
from services.janitor.metrics import observe_system
from services.janitor.scheduler import Scheduler
from shared.export.cadence import Cadence
from shared.export.request import ExportRequest
from shared.ids import new_operation_id, new_schedule_id
from shared.repository import schedule_runs, schedules
from shared.repository.message_store import put_members, remove_member
from shared.repository.schedule_runs import FireOutcome
from shared.repository.submissions import SubmitOutcome
from shared.settings import Settings
from shared.states import PauseReason, ScheduleState, WaitingReason
from shared.webhooks.signing import secret_text, user_secret
from tests.support import AMQP_URL, make_settings, wait_for
from tests.support.api_calls import metric_samples, running_pipeline, verified_callback
from tests.support.rows import insert_operation
from tests.support.webhook_peers import Receiver, listening

CID = "c-a"
# A due time every second on the real clock: the test-only minimum interval.
EVERY = "PT1S"
# Steps of time moved by hand.
STEP = "PT10S"
STEP_SECONDS = 10
# Short enough that a janitor fires within a fraction of the interval.
SCHEDULER_INTERVAL_SECONDS = 0.1
# The schedules seen with more than one unfinished run.
UNFINISHED_TWICE = """
    SELECT coalesce(array_agg(schedule_id), '{}') FROM (
        SELECT schedule_id FROM operations WHERE schedule_id IS NOT NULL AND state = 'QUEUED'
        GROUP BY schedule_id HAVING count(*) > 1) doubled
"""
# Every schedule is alice's, and every run counts toward her active exports.
MAX_ACTIVE_EXPORTS = 1000
# Ends the QUEUED runs the way a worker would end them, for tests that run no worker.
END_RUNS = (
    "UPDATE operations SET state = 'FAILED', finished_at = now() WHERE schedule_id IS NOT NULL AND state = 'QUEUED'"
)


@pytest.fixture
async def settings(database_url: str, moto: MotoServer) -> AsyncIterator[Settings]:
    """This test's settings with a fast scheduler, the test-only minimum interval, room for many active exports,
    and callbacks allowed to a local receiver.
    """
    test_settings = make_settings(
        database_url,
        moto.endpoint_url,
        scheduler_interval_seconds=SCHEDULER_INTERVAL_SECONDS,
        schedule_min_interval_seconds=1,
        webhook_allow_private=True,
        max_active_exports=MAX_ACTIVE_EXPORTS,
    )
    yield test_settings
    await delete_broker_objects(test_settings)


@pytest.fixture
async def members(pool: asyncpg.Pool) -> None:
    """``c-a`` with members alice and bob."""
    async with pool.acquire() as conn:
        await put_members(conn, conversation_id=CID, members=["alice", "bob"])


@pytest.fixture
def scheduler(pool: asyncpg.Pool, settings: Settings) -> Scheduler:
    return Scheduler(pool=pool, settings=settings)


async def create(
    pool: asyncpg.Pool, key: str = "k1", *, every: str = STEP, notify_url: str | None = None, owner: str = "alice"
) -> str:
    """``owner``'s incremental schedule of ``c-a``, anchored at its creation."""
    async with pool.acquire() as conn:
        result = await schedules.create_schedule(
            conn,
            schedule_id=new_schedule_id(),
            owner_id=owner,
            conversation_id=CID,
            idempotency_key=key,
            fingerprint=f"fp-{key}",
            every=Cadence.parse(every),
            start_at=None,
            mode="incremental",
            request=ExportRequest(notify_url=notify_url),
            replay_window_seconds=3600,
            max_schedules=1000,
        )
    assert result.outcome is SubmitOutcome.CREATED and result.schedule_id is not None
    return result.schedule_id


async def time_passes(pool: asyncpg.Pool, steps: int) -> None:
    """Move every schedule and run ``steps`` intervals of ``STEP`` back, as if that much time had passed."""
    shift = f"{steps * STEP_SECONDS} s"
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "UPDATE export_schedules SET start_at = start_at - $1::text::interval,"
            " next_run_at = next_run_at - $1::text::interval",
            shift,
        )
        # By way of a range no run is in: the unique (schedule_id, due_at) is checked row by row.
        await conn.execute(
            "UPDATE operations SET due_at = due_at + interval '1000 years' WHERE schedule_id IS NOT NULL"
        )
        await conn.execute(
            "UPDATE operations SET due_at = due_at - interval '1000 years' - $1::text::interval"
            " WHERE schedule_id IS NOT NULL",
            shift,
        )


async def runs(pool: asyncpg.Pool, schedule_id: str) -> list[asyncpg.Record]:
    """The schedule's runs, by due time."""
    return await pool.fetch(
        "SELECT operation_id, due_at, state, created_at FROM operations WHERE schedule_id = $1 ORDER BY due_at",
        schedule_id,
    )


async def fired(scheduler: Scheduler) -> Counter[str]:
    """One round of ``scheduler``: how many fires ended with each outcome."""
    return await scheduler.run_round(stop=asyncio.Event())


async def view(pool: asyncpg.Pool, schedule_id: str) -> schedules.ScheduleView:
    """The schedule as alice reads it."""
    async with pool.acquire() as conn:
        schedule = await schedules.read_schedule(conn, schedule_id=schedule_id, owner_id="alice")
    assert schedule is not None
    return schedule


def sample(name: str, **labels: str) -> float:
    """A sample of this process's registry (the scheduler in the test's event loop counts there); 0 when absent."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_due_times_during_an_unfinished_run_are_coalesced_into_one_run(
    pool: asyncpg.Pool, members: None, scheduler: Scheduler
) -> None:
    schedule_id = await create(pool)
    created_before = sample("chatexport_schedule_runs_created_total")
    assert await fired(scheduler) == Counter({FireOutcome.CREATED: 1})
    await time_passes(pool, 5)

    assert await fired(scheduler) == Counter(), "the first run is unfinished"
    await pool.execute(END_RUNS)
    assert await fired(scheduler) == Counter({FireOutcome.CREATED: 1})

    first, second = await runs(pool, schedule_id)
    schedule = await view(pool, schedule_id)
    # One run for the five due times that came meanwhile, keyed by the latest of them.
    assert first["due_at"] == schedule.start_at
    assert second["due_at"] == schedule.every.due_at(schedule.start_at, 5)
    assert schedule.last_operation_id == second["operation_id"]
    assert schedule.next_run_at == schedule.every.due_at(schedule.start_at, 6)
    assert sample("chatexport_schedule_runs_created_total") - created_before == 2
    assert sample("chatexport_schedule_fires_total", outcome="created") >= 2


async def test_ten_missed_intervals_become_one_run_keyed_by_the_latest(
    pool: asyncpg.Pool, members: None, scheduler: Scheduler
) -> None:
    schedule_id = await create(pool)
    await time_passes(pool, 10)  # nobody fired: the janitor was down
    await observe_system(pool)
    assert sample("chatexport_schedule_due_lag_seconds") >= 10 * STEP_SECONDS

    assert await fired(scheduler) == Counter({FireOutcome.CREATED: 1})
    [run] = await runs(pool, schedule_id)
    schedule = await view(pool, schedule_id)
    assert run["due_at"] == schedule.every.due_at(schedule.start_at, 10)

    # The missed due times are not made up for once the run has ended: the next one is in the future.
    await pool.execute(END_RUNS)
    assert await fired(scheduler) == Counter()
    assert len(await runs(pool, schedule_id)) == 1
    await observe_system(pool)
    assert sample("chatexport_schedule_due_lag_seconds") == 0


async def test_concurrent_fires_bypassing_the_lock_create_one_run_per_due_time(
    pool: asyncpg.Pool, members: None, scheduler: Scheduler
) -> None:
    ids = [await create(pool, f"k{n}") for n in range(20)]

    async def fire_all(conn: asyncpg.Connection) -> Counter[str]:
        outcomes: Counter[str] = Counter()
        for schedule_id in ids:
            fire = schedule_runs.fire(
                conn, schedule_id=schedule_id, operation_id=new_operation_id(), max_active=MAX_ACTIVE_EXPORTS
            )
            outcomes[(await fire).outcome] += 1
        return outcomes

    async with pool.acquire() as one, pool.acquire() as two:
        for _ in range(3):
            by_one, by_two, by_scheduler = await asyncio.gather(fire_all(one), fire_all(two), fired(scheduler))
            outcomes = by_one + by_two + by_scheduler
            # Each due schedule fired once; every other try found it fired (or, racing, its run existing).
            assert outcomes[FireOutcome.CREATED] == len(ids), outcomes
            assert set(outcomes) <= {FireOutcome.CREATED, FireOutcome.NOT_DUE, FireOutcome.DUPLICATE}, outcomes
            await pool.execute(END_RUNS)
            await time_passes(pool, 1)

    for schedule_id in ids:
        due_times = [run["due_at"] for run in await runs(pool, schedule_id)]
        assert len(due_times) == len(set(due_times)) == 3


async def test_at_the_quota_the_run_waits_and_is_created_once_a_slot_frees(
    pool: asyncpg.Pool, members: None, settings: Settings
) -> None:
    scheduler = Scheduler(pool=pool, settings=settings.model_copy(update={"max_active_exports": 1}))
    await insert_operation(pool, "op_busy", "QUEUED", owner_id="alice")
    schedule_id = await create(pool)

    for _ in range(2):  # waiting, not dropped
        assert await fired(scheduler) == Counter({FireOutcome.WAITING_FOR_QUOTA: 1})
        assert (await view(pool, schedule_id)).waiting_reason is WaitingReason.ACTIVE_EXPORT_QUOTA
        assert await runs(pool, schedule_id) == []
    await observe_system(pool)
    assert sample("chatexport_schedules", state="WAITING") == 1

    await pool.execute("UPDATE operations SET state = 'CANCELED', finished_at = now() WHERE operation_id = 'op_busy'")
    assert await fired(scheduler) == Counter({FireOutcome.CREATED: 1})
    [run] = await runs(pool, schedule_id)
    schedule = await view(pool, schedule_id)
    assert schedule.waiting_reason is None and schedule.last_operation_id == run["operation_id"]
    await observe_system(pool)
    assert sample("chatexport_schedules", state="WAITING") == 0
    assert sample("chatexport_schedules", state="ACTIVE") == 1


async def test_schedules_waiting_for_a_full_quota_hold_back_no_one_elses(
    pool: asyncpg.Pool, members: None, settings: Settings
) -> None:
    limits = {"max_active_exports": 1, "janitor_batch_size": 2}
    scheduler = Scheduler(pool=pool, settings=settings.model_copy(update=limits))
    await insert_operation(pool, "op_busy", "QUEUED", owner_id="alice")
    alices = [await create(pool, f"k{n}") for n in range(3)]
    bobs = await create(pool, "k-bob", owner="bob")
    # Alice's are due the longest: more of them than a page, at the head of the order.
    await pool.execute(
        "UPDATE export_schedules SET next_run_at = next_run_at - interval '1 hour' WHERE owner_id = 'alice'"
    )

    assert await fired(scheduler) == Counter({FireOutcome.WAITING_FOR_QUOTA: 3, FireOutcome.CREATED: 1})
    assert len(await runs(pool, bobs)) == 1
    for schedule_id in alices:
        assert (await view(pool, schedule_id)).waiting_reason is WaitingReason.ACTIVE_EXPORT_QUOTA
    # An owner's full quota is not the firing part's lag.
    await observe_system(pool)
    assert sample("chatexport_schedule_due_lag_seconds") == 0


async def test_after_a_resume_the_next_run_is_at_the_next_due_time(
    pool: asyncpg.Pool, members: None, scheduler: Scheduler
) -> None:
    schedule_id = await create(pool)
    assert await fired(scheduler) == Counter({FireOutcome.CREATED: 1})
    await pool.execute(END_RUNS)
    async with pool.acquire() as conn:
        paused = await schedules.pause(conn, schedule_id=schedule_id, owner_id="alice")
        assert paused is not None and paused.paused_reason is PauseReason.USER
        await time_passes(pool, 5)
        resumed = await schedules.resume(conn, schedule_id=schedule_id, owner_id="alice")
    schedule = resumed.schedule
    assert schedule is not None and schedule.state is ScheduleState.ACTIVE
    assert schedule.next_run_at == schedule.every.due_at(schedule.start_at, 6)
    # Nothing for the due times of the pause.
    assert await fired(scheduler) == Counter()

    await time_passes(pool, 1)
    assert await fired(scheduler) == Counter({FireOutcome.CREATED: 1})
    schedule = await view(pool, schedule_id)
    assert [run["due_at"] for run in await runs(pool, schedule_id)] == [
        schedule.start_at,
        schedule.every.due_at(schedule.start_at, 6),
    ]


async def test_a_revoked_members_schedule_pauses_and_its_callback_arrives(
    pool: asyncpg.Pool, members: None, settings: Settings, s3: Any
) -> None:
    receiver = Receiver()
    async with listening(receiver) as port, running_pipeline(settings):
        schedule_id = await create(pool, every=EVERY, notify_url=f"http://127.0.0.1:{port}/hook")
        await wait_for(lambda: _has_succeeded_run(pool, schedule_id), timeout=30)
        async with pool.acquire() as conn:
            await remove_member(conn, conversation_id=CID, user_id="alice")

        schedule = await wait_for(lambda: _paused(pool, schedule_id), timeout=30)
        assert schedule.paused_reason is PauseReason.ACCESS_REVOKED and schedule.next_run_at is None
        paused = await wait_for(lambda: _callbacks(receiver, "schedule.paused", settings), timeout=30)

    [message] = paused
    data = message["data"]
    assert (data["schedule_id"], data["state"], data["paused_reason"]) == (schedule_id, "PAUSED", "ACCESS_REVOKED")
    assert data["next_run_at"] is None
    # Paused once, whichever noticed first (the fire, or a run refused for the revoked member).
    deliveries = await pool.fetchval("SELECT count(*) FROM webhook_deliveries WHERE schedule_id = $1", schedule_id)
    assert deliveries == 1
    assert all(run["state"] in ("SUCCEEDED", "FAILED") for run in await runs(pool, schedule_id))


async def _has_succeeded_run(pool: asyncpg.Pool, schedule_id: str) -> bool:
    return any(run["state"] == "SUCCEEDED" for run in await runs(pool, schedule_id))


async def _paused(pool: asyncpg.Pool, schedule_id: str) -> schedules.ScheduleView | None:
    schedule = await view(pool, schedule_id)
    return schedule if schedule.state is ScheduleState.PAUSED else None


def _callbacks(receiver: Receiver, event_type: str, settings: Settings) -> list[dict[str, Any]]:
    """The callbacks of ``event_type`` the receiver got, each once its signature checks out with alice's secret."""
    secret = secret_text(user_secret(settings.webhook_signing_key.encode(), "alice"))
    messages = [verified_callback(secret, headers, body) for headers, body in receiver.received]
    return [message for message in messages if message["type"] == event_type]


# -- Real janitor processes --------------------------------------------------------------------------------

# Any key: the test's database is its own.
HOLD_RUNS_LOCK = 4242


@contextlib.contextmanager
def janitor_processes(settings: Settings, log_dir: Path) -> Iterator[LocalSystem]:
    """The compose file's janitor, to be started as local processes (``start_janitor``) on this test's database
    and bucket, with a fast scheduler and room for many active exports; every one stopped at the end.
    """
    system = LocalSystem(
        database_url=settings.database_url,
        amqp_url=AMQP_URL,
        log_dir=log_dir,
        overrides={
            "CHATEXPORT_S3_ENDPOINT_URL": settings.s3_endpoint_url or "",
            "CHATEXPORT_S3_BUCKET": settings.s3_bucket,
            **MOTO_CREDENTIALS,
            "CHATEXPORT_JANITOR_INTERVAL_SECONDS": "0.5",
            "CHATEXPORT_SCHEDULER_INTERVAL_SECONDS": str(SCHEDULER_INTERVAL_SECONDS),
            "CHATEXPORT_MAX_ACTIVE_EXPORTS": str(MAX_ACTIVE_EXPORTS),
        },
    )
    try:
        yield system
    finally:
        codes = system.stop()
    # Every janitor the test did not kill drained and exited on SIGTERM.
    assert all(code in (0, -signal.SIGTERM) for code in codes.values() if code != -signal.SIGKILL), codes


async def start_janitor(system: LocalSystem, name: str) -> None:
    """Start a janitor process called ``name`` and wait until it is ready."""
    system.start_part("janitor", name=name)
    await asyncio.to_thread(system.wait_ready, [name])


async def janitor_metrics(system: LocalSystem, name: str) -> dict[str, float]:
    """What the janitor process ``name`` serves on ``/metrics`` now."""
    url = f"http://127.0.0.1:{system.metrics_ports[name]}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return metric_samples(await response.text())


def errors_logged(system: LocalSystem, name: str) -> list[str]:
    """The lines at level ERROR that the process ``name`` printed."""
    return [line for line in system.group.part(name).tail if '"level": "ERROR"' in line]


async def test_two_janitors_and_a_firer_bypassing_the_lock_create_no_duplicate_run(
    pool: asyncpg.Pool, members: None, settings: Settings, s3: Any, tmp_path: Path
) -> None:
    ids = [await create(pool, f"k{n}", every=EVERY) for n in range(10)]
    stop = asyncio.Event()

    async def bypass(conn: asyncpg.Connection) -> None:
        """Fires every schedule at the scheduler's pace without the leader lock, as a frozen leader woken up
        would.
        """
        while not stop.is_set():
            for schedule_id in ids:
                await schedule_runs.fire(
                    conn, schedule_id=schedule_id, operation_id=new_operation_id(), max_active=MAX_ACTIVE_EXPORTS
                )
            await asyncio.sleep(SCHEDULER_INTERVAL_SECONDS)  # a pace, not a wait for anything

    doubled: list[str] = []

    async def finish_runs() -> None:
        """Ends the runs as a fast worker would, noting any schedule seen with two unfinished runs."""
        while not stop.is_set():
            doubled.extend(await pool.fetchval(UNFINISHED_TWICE))
            await pool.execute(END_RUNS)
            await asyncio.sleep(0.05)  # the pace of a fast worker, not a wait for anything

    with janitor_processes(settings, tmp_path) as system:
        await start_janitor(system, "janitor-1")
        await start_janitor(system, "janitor-2")
        async with pool.acquire() as conn:
            firing = [asyncio.create_task(work) for work in (bypass(conn), finish_runs())]
            try:
                await wait_for(lambda: _runs_created_by(system, ["janitor-1", "janitor-2"]), timeout=30)
                leader, standby = await leader_first(system, ["janitor-1", "janitor-2"])
                assert await fires(system, standby) == 0, "a standby does not fire"
                system.group.kill(leader)
                await wait_for(lambda: _runs_created_by(system, [standby]), timeout=30)
            finally:
                stop.set()
                await asyncio.gather(*firing)
        assert errors_logged(system, standby) == []

    assert doubled == [], "at most one unfinished run per schedule"
    for schedule_id in ids:
        all_runs = await runs(pool, schedule_id)
        assert len({run["due_at"] for run in all_runs}) == len(all_runs) >= 2
        assert all(run["due_at"] <= run["created_at"] for run in all_runs), "none before its due time"


async def leader_first(system: LocalSystem, names: list[str]) -> list[str]:
    """``names`` with the janitor that leads now first."""
    leading = {name: (await janitor_metrics(system, name))["chatexport_janitor_leader{}"] for name in names}
    return sorted(names, key=lambda name: -leading[name])


async def fires(system: LocalSystem, name: str) -> float:
    """The fires the janitor process ``name`` counted, whatever their outcome."""
    samples = await janitor_metrics(system, name)
    return sum(value for key, value in samples.items() if key.startswith("chatexport_schedule_fires_total{"))


async def _runs_created_by(system: LocalSystem, names: list[str]) -> bool:
    counts = [(await janitor_metrics(system, name))["chatexport_schedule_runs_created_total{}"] for name in names]
    return sum(counts) > 0


async def test_a_janitor_killed_while_it_fires_leaves_nothing_and_the_next_one_fires_once(
    pool: asyncpg.Pool, members: None, settings: Settings, s3: Any, tmp_path: Path
) -> None:
    # Every run's insert waits for a lock this test holds, inside the transaction that fires.
    await pool.execute(
        f"""
        CREATE FUNCTION hold_run() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_advisory_xact_lock({HOLD_RUNS_LOCK}); RETURN NULL; END $$;
        CREATE TRIGGER hold_run AFTER INSERT ON operations FOR EACH ROW WHEN (NEW.schedule_id IS NOT NULL)
            EXECUTE FUNCTION hold_run();
        """
    )
    schedule_id = await create(pool, every="PT1H")  # one due time during the test: its anchor
    holder = await asyncpg.connect(settings.database_url)
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", HOLD_RUNS_LOCK)
        with janitor_processes(settings, tmp_path) as system:
            await start_janitor(system, "janitor-1")
            firing_pid = await wait_for(lambda: _waiting_for(pool, HOLD_RUNS_LOCK), timeout=30)
            system.group.kill("janitor-1")
            await start_janitor(system, "janitor-2")
            await holder.execute("SELECT pg_advisory_unlock($1)", HOLD_RUNS_LOCK)
            await wait_for(lambda: _gone(pool, firing_pid), timeout=30)

            [run] = await wait_for(lambda: runs(pool, schedule_id), timeout=30)
            schedule = await view(pool, schedule_id)
            assert run["due_at"] == schedule.start_at and schedule.last_operation_id == run["operation_id"]
            assert (await janitor_metrics(system, "janitor-2"))["chatexport_schedule_runs_created_total{}"] == 1
    finally:
        await holder.close()
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE operation_id = $1", run["operation_id"]) == 1
    assert await pool.fetchval("SELECT count(*) FROM operations") == 1


async def _waiting_for(pool: asyncpg.Pool, key: int) -> int | None:
    """The server process of a session waiting for the advisory lock ``key``, if any."""
    pid: int | None = await pool.fetchval(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND NOT granted", key
    )
    return pid


async def _gone(pool: asyncpg.Pool, pid: int) -> bool:
    return not await pool.fetchval("SELECT true FROM pg_stat_activity WHERE pid = $1", pid)
