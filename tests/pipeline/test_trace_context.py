"""The stored trace context on a real Postgres (docs/monitoring.md: Monitoring, Traces): every wake-up of an
operation (its first run, a retry, a chunk) and every callback about it is claimed with the traceparent its
submit stored, whoever wrote the row; a scheduled run carries its fire's, and a schedule its creation's.
"""

from __future__ import annotations

import asyncpg
import pytest

from shared.export.cadence import Cadence
from shared.export.request import ExportRequest
from shared.ids import new_operation_id, new_schedule_id
from shared.repository import outbox, schedule_runs, schedules, webhook_deliveries
from shared.repository.message_store import put_members
from shared.repository.submissions import SubmitOutcome, submit_export

pytestmark = pytest.mark.module_database

SUBMIT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
FIRE = "00-11111111111111111111111111111111-2222222222222222-01"
CREATE = "00-33333333333333333333333333333333-4444444444444444-01"


@pytest.fixture
async def conn(pool: asyncpg.Pool) -> asyncpg.Connection:
    async with pool.acquire() as connection:
        await put_members(connection, conversation_id="c-a", members=["alice"])
        yield connection


async def submit(conn: asyncpg.Connection, key: str, traceparent: str | None) -> str:
    operation_id = new_operation_id()
    result = await submit_export(
        conn,
        operation_id=operation_id,
        owner_id="alice",
        conversation_id="c-a",
        idempotency_key=key,
        fingerprint=f"fp-{key}",
        request=ExportRequest(),
        replay_window_seconds=3600,
        max_active=100,
        limits=None,
        traceparent=traceparent,
    )
    assert result.outcome in (SubmitOutcome.CREATED, SubmitOutcome.REPLAYED)
    assert result.operation_id is not None
    return result.operation_id


async def create_schedule(conn: asyncpg.Connection, key: str, *, mode: str) -> schedules.CreateResult:
    """alice's hourly schedule of ``c-a``, created in the trace ``CREATE``."""
    return await schedules.create_schedule(
        conn,
        schedule_id=new_schedule_id(),
        owner_id="alice",
        conversation_id="c-a",
        idempotency_key=key,
        fingerprint=f"fp-{key}",
        every=Cadence.parse("PT1H"),
        start_at=None,
        mode=mode,
        request=ExportRequest(),
        replay_window_seconds=3600,
        max_schedules=5,
        traceparent=CREATE,
    )


async def claimed(conn: asyncpg.Connection) -> dict[str, set[str | None]]:
    """Every due outbox row's operation and trace context, claimed (and marked, so each is seen once)."""
    seen: dict[str, set[str | None]] = {}
    async with conn.transaction():
        rows = (await outbox.claim_due(conn, limit=100)).rows
        await outbox.mark_published(conn, outbox_ids=[row.outbox_id for row in rows])
    for row in rows:
        seen.setdefault(row.operation_id, set()).add(row.traceparent)
    return seen


async def test_every_wake_up_of_an_operation_carries_its_submits_context(conn: asyncpg.Connection) -> None:
    traced = await submit(conn, "k1", SUBMIT)
    untraced = await submit(conn, "k2", None)
    # A replay with another context changes nothing.
    assert await submit(conn, "k1", FIRE) == traced
    assert await claimed(conn) == {traced: {SUBMIT}, untraced: {None}}
    await outbox.enqueue_run(conn, operation_id=traced)  # a retry, a re-enqueue, a cancel
    await outbox.enqueue_chunk(conn, operation_id=traced, chunk_no=2)
    assert await claimed(conn) == {traced: {SUBMIT}}


async def test_a_callback_carries_the_context_of_what_it_reports(conn: asyncpg.Connection) -> None:
    operation_id = await submit(conn, "k3", SUBMIT)
    schedule = await create_schedule(conn, "k4", mode="incremental")
    await conn.executemany(
        "INSERT INTO webhook_deliveries (webhook_id, operation_id, schedule_id, owner_id, event_type, url)"
        " VALUES ($1, $2, $3, 'alice', $4, 'https://hooks.example/cb')",
        [("w-op", operation_id, None, "export.succeeded"), ("w-sc", None, schedule.schedule_id, "schedule.paused")],
    )
    due = await webhook_deliveries.claim_due(conn, limit=10, lease_seconds=60)
    assert {delivery.webhook_id: delivery.traceparent for delivery in due} == {"w-op": SUBMIT, "w-sc": CREATE}


async def test_a_scheduled_run_carries_its_fires_context_and_the_fire_sees_the_creations(
    conn: asyncpg.Connection,
) -> None:
    await claimed(conn)  # what earlier tests left
    schedule = await create_schedule(conn, "k5", mode="full")
    assert schedule.schedule_id is not None
    due = [
        each for each in await schedule_runs.due_schedules(conn, limit=10) if each.schedule_id == schedule.schedule_id
    ]
    assert [each.traceparent for each in due] == [CREATE]
    run = new_operation_id()
    fired = await schedule_runs.fire(
        conn, schedule_id=schedule.schedule_id, operation_id=run, max_active=100, traceparent=FIRE
    )
    assert fired.operation_id == run
    assert await claimed(conn) == {run: {FIRE}}
