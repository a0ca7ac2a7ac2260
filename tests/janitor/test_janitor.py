"""The janitor's passes on real Postgres and a moto server, with the state arranged row by row."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from services.janitor import main as janitor_main
from services.janitor.janitor import Janitor
from shared.db import connect
from shared.settings import Settings
from tests.support import wait_for
from tests.support.bucket import keys, open_uploads
from tests.support.rows import insert_artifact, insert_operation, shift

MIB = 1024 * 1024


@pytest.fixture
def janitor(pool: asyncpg.Pool, s3: Any, settings: Settings) -> Janitor:
    return Janitor(pool=pool, s3=s3, settings=settings.model_copy(update={"janitor_orphan_grace_seconds": 60}))


async def test_unpublishable_artifacts_are_removed_after_the_grace_period_and_nothing_else(
    janitor: Janitor, pool: asyncpg.Pool, s3: Any, settings: Settings
) -> None:
    bucket = settings.s3_bucket
    await insert_operation(pool, "op_done", "SUCCEEDED", generation=3, result_key="exports/op_done/g3.jsonl")
    await insert_operation(pool, "op_running", "RUNNING", generation=1, lease_expires_at=None)
    old = await pool.fetchval("SELECT now() - interval '2 minutes'")

    superseded = await insert_artifact(pool, "op_done", 1, "COMPLETE", updated_at=old)
    # The worker died after creating the upload but before recording its id.
    await s3.create_multipart_upload(Bucket=bucket, Key="exports/op_done/g2.jsonl")
    crashed = await insert_artifact(pool, "op_done", 2, "WRITING", updated_at=old)
    published = await insert_artifact(pool, "op_done", 3, "PUBLISHED", updated_at=old)
    fresh = await insert_artifact(pool, "op_running", 0, "WRITING")  # superseded, but within the grace period
    current = await insert_artifact(pool, "op_running", 1, "WRITING", updated_at=old)  # the live attempt's
    for key in (superseded, published, fresh, current):
        await s3.put_object(Bucket=bucket, Key=key, Body=b"{}\n")

    assert len(await janitor.remove_stale_artifacts()) == 2
    assert await keys(s3, settings) == {published, fresh, current}
    assert crashed not in await open_uploads(s3, settings)
    states = dict(await pool.fetch("SELECT object_key, state FROM artifacts"))
    assert states == {
        superseded: "DELETED",
        crashed: "DELETED",
        published: "PUBLISHED",
        fresh: "WRITING",
        current: "WRITING",
    }
    assert await janitor.remove_stale_artifacts() == []


async def test_expired_results_lose_their_object_and_old_records_are_purged(
    janitor: Janitor, pool: asyncpg.Pool, s3: Any, settings: Settings
) -> None:
    await insert_operation(pool, "op_old", "SUCCEEDED", generation=1, result_key="exports/op_old/g1.jsonl")
    await pool.execute("UPDATE operations SET result_expires_at = now() - interval '1 second'")
    key = await insert_artifact(pool, "op_old", 1, "PUBLISHED")
    await s3.put_object(Bucket=settings.s3_bucket, Key=key, Body=b"{}\n")
    await pool.execute(
        "INSERT INTO idempotency_keys (owner_id, idempotency_key, fingerprint, operation_id)"
        " VALUES ('alice', 'k', 'f', 'op_old')"
    )

    assert await janitor.expire_results() == 1
    assert await pool.fetchval("SELECT state FROM operations") == "EXPIRED"
    assert await keys(s3, settings) == set()
    assert await pool.fetchval("SELECT state FROM artifacts") == "DELETED"
    assert await pool.fetchval("SELECT outcome FROM access_events WHERE action = 'delete_result'") == "EXPIRED"

    report = await janitor.run_pass()
    assert report.purged == 0  # younger than the record retention
    await pool.execute("UPDATE operations SET created_at = now() - interval '31 days'")
    assert (await janitor.run_pass()).purged == 1
    assert await pool.fetchval("SELECT count(*) FROM operations") == 0
    assert await pool.fetchval("SELECT count(*) FROM idempotency_keys") == 0


async def test_stranded_operations_get_one_new_wake_up(janitor: Janitor, pool: asyncpg.Pool) -> None:
    await insert_operation(pool, "op_lease", "RUNNING", generation=1)
    await pool.execute("UPDATE operations SET lease_expires_at = now() - interval '1 second'")
    await insert_operation(pool, "op_live", "RUNNING", generation=1)
    await pool.execute(
        "UPDATE operations SET lease_expires_at = now() + interval '1 minute' WHERE operation_id = 'op_live'"
    )
    await insert_operation(pool, "op_lost", "QUEUED")
    await pool.execute("UPDATE operations SET updated_at = now() - interval '2 minutes' WHERE operation_id = 'op_lost'")
    await insert_operation(pool, "op_new", "QUEUED")

    assert await janitor.requeue_stranded() == {"lease_expired": 1, "retry_due": 0, "message_lost": 1}
    woken = {row["operation_id"] for row in await pool.fetch("SELECT operation_id FROM outbox")}
    assert woken == {"op_lease", "op_lost"}
    assert sum((await janitor.requeue_stranded()).values()) == 0  # a wake-up is already on its way


async def test_abandoned_cancellations_are_finished_with_their_objects_removed(
    janitor: Janitor, pool: asyncpg.Pool, s3: Any, settings: Settings
) -> None:
    await insert_operation(pool, "op_c", "CANCEL_REQUESTED", generation=1)
    key = await insert_artifact(pool, "op_c", 1, "WRITING")
    await s3.put_object(Bucket=settings.s3_bucket, Key=key, Body=b"{}\n")
    await insert_operation(pool, "op_held", "CANCEL_REQUESTED", generation=1)
    await pool.execute(
        "UPDATE operations SET lease_expires_at = now() + interval '1 minute' WHERE operation_id = 'op_held'"
    )

    assert await janitor.finish_abandoned_cancellations() == 1
    states = dict(await pool.fetch("SELECT operation_id, state FROM operations"))
    assert states == {"op_c": "CANCELED", "op_held": "CANCEL_REQUESTED"}
    assert await keys(s3, settings) == set()


async def test_an_expired_result_whose_deletion_failed_is_retried_and_keeps_its_record(
    janitor: Janitor, pool: asyncpg.Pool, s3: Any, settings: Settings
) -> None:
    # As left by a pass that committed EXPIRED and then lost S3 (or crashed) before deleting.
    await insert_operation(pool, "op_exp", "EXPIRED", generation=1, result_key="exports/op_exp/g1.jsonl")
    await shift(pool, "op_exp", "created_at", "-31 days")
    key = await insert_artifact(
        pool, "op_exp", 1, "PUBLISHED", updated_at=await pool.fetchval("SELECT now() - interval '2 minutes'")
    )
    await s3.put_object(Bucket=settings.s3_bucket, Key=key, Body=b"{}\n")

    assert len(await janitor.remove_stale_artifacts()) == 1
    assert await keys(s3, settings) == set()
    assert (await janitor.run_pass()).purged == 1


async def test_a_record_is_not_purged_while_its_object_is_not_removed(
    janitor: Janitor, pool: asyncpg.Pool, s3: Any, settings: Settings
) -> None:
    await insert_operation(pool, "op_keep", "EXPIRED", generation=1, result_key="exports/op_keep/g1.jsonl")
    await shift(pool, "op_keep", "created_at", "-31 days")
    await insert_artifact(pool, "op_keep", 1, "PUBLISHED")  # within the grace period: not removed yet

    assert (await janitor.run_pass()).purged == 0
    assert await pool.fetchval("SELECT count(*) FROM operations") == 1


async def test_a_janitor_whose_new_session_ends_before_it_asks_for_the_lock_waits_for_the_next_pass(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def connect_then_lose_the_session(settings: Settings, **options: Any) -> asyncpg.Connection:
        conn = await connect(settings, **options)
        admin = await connect(settings)
        try:
            await admin.fetchval("SELECT pg_terminate_backend($1)", conn.get_server_pid())
        finally:
            await admin.close()
        return conn

    monkeypatch.setattr(janitor_main, "connect", connect_then_lose_the_session)
    assert await janitor_main._lead(settings, None) is None

    monkeypatch.undo()
    leader = await janitor_main._lead(settings, None)
    assert leader is not None, "the next pass takes the lock"
    await leader.close()


async def test_a_leader_frozen_inside_its_touch_loses_the_lock_to_a_standby(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The touch before each pass is a short transaction: a leader stopped between its BEGIN and its COMMIT
    # leaves the session idle in a transaction, which must end as an idle session does.
    monkeypatch.setattr(janitor_main, "_leader_idle_ms", lambda settings: 300)
    leader = await janitor_main._lead(settings, None)
    assert leader is not None
    try:
        await leader.execute("BEGIN")
        standby = await wait_for(lambda: janitor_main._lead(settings, None), timeout=10)
        await standby.close()
    finally:
        leader.terminate()
