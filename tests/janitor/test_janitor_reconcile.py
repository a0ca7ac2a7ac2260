"""The janitor's reconciliation of the bucket with the artifact records, what each pass counts, and the system
gauges, on real Postgres and a moto server. Counters are read from the default registry before and after.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from services.janitor.janitor import Janitor
from services.janitor.metrics import observe_system
from shared.settings import Settings
from shared.states import State
from tests.support import wait_for
from tests.support.bucket import all_keys, keys, older_than_grace, put, start_upload, uploads
from tests.support.rows import insert_artifact, insert_operation, shift

# Long enough that an object written just before a pass is still younger (S3 times are whole seconds).
GRACE_SECONDS = 3.0

# The states whose oldest operation's age is a gauge.
WAITING_STATES = ("QUEUED", "RUNNING", "RETRY_AT", "CANCEL_REQUESTED", "FAILED_REPAIR")

# Every counter the janitor moves, by a short name: (sample name, labels).
COUNTERS: dict[str, tuple[str, dict[str, str]]] = {
    "expired": ("chatexport_janitor_results_expired_total", {}),
    "lease_expired": ("chatexport_janitor_operations_requeued_total", {"reason": "lease_expired"}),
    "retry_due": ("chatexport_janitor_operations_requeued_total", {"reason": "retry_due"}),
    "message_lost": ("chatexport_janitor_operations_requeued_total", {"reason": "message_lost"}),
    "canceled": ("chatexport_cancellations_finished_total", {"by": "janitor"}),
    "stale": ("chatexport_janitor_stale_artifacts_removed_total", {}),
    "unknown_writing": ("chatexport_janitor_unknown_state_artifacts_total", {"state": "WRITING"}),
    "unknown_complete": ("chatexport_janitor_unknown_state_artifacts_total", {"state": "COMPLETE"}),
    "unknown_removing": ("chatexport_janitor_unknown_state_artifacts_total", {"state": "REMOVING"}),
    "orphans": ("chatexport_janitor_orphan_objects_removed_total", {}),
    "uploads": ("chatexport_janitor_stale_uploads_aborted_total", {}),
    "purged": ("chatexport_janitor_records_purged_total", {}),
    "passes_ok": ("chatexport_janitor_passes_total", {"outcome": "ok"}),
    "passes_failed": ("chatexport_janitor_passes_total", {"outcome": "failed"}),
    "pass_durations": ("chatexport_janitor_pass_duration_seconds_count", {}),
}


def counters() -> dict[str, float]:
    return {name: REGISTRY.get_sample_value(sample, labels) or 0.0 for name, (sample, labels) in COUNTERS.items()}


def moved(before: dict[str, float], **expected: int) -> None:
    """Assert that every counter moved from ``before`` by ``expected`` (0 when not named)."""
    after = counters()
    assert {name: after[name] - before[name] for name in COUNTERS} == {name: expected.get(name, 0) for name in COUNTERS}


def gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


@pytest.fixture
def janitor(pool: asyncpg.Pool, s3: Any, settings: Settings) -> Janitor:
    return Janitor(
        pool=pool, s3=s3, settings=settings.model_copy(update={"janitor_orphan_grace_seconds": GRACE_SECONDS})
    )


async def test_a_pass_removes_what_no_live_record_names_and_keeps_the_rest(
    janitor: Janitor, pool: asyncpg.Pool, s3: Any, settings: Settings
) -> None:
    # Survivors: a published result, a live attempt's upload (moto reports every upload as initiated in
    # 2010, far past the grace), and anything outside the prefix.
    await insert_operation(pool, "op_done", "SUCCEEDED", generation=1, result_key="exports/op_done/g1.jsonl")
    published = await put(s3, settings, await insert_artifact(pool, "op_done", 1, "PUBLISHED", upload_id="recorded"))
    await insert_operation(pool, "op_running", "RUNNING", generation=1)
    await shift(pool, "op_running", "lease_expires_at", "1 minute")
    running_key = "exports/op_running/g1.jsonl"
    running_upload = await start_upload(s3, settings, running_key)
    await insert_artifact(pool, "op_running", 1, "WRITING", upload_id=running_upload[1])
    outside = await put(s3, settings, "elsewhere/op_x/g1.jsonl")
    outside_upload = await start_upload(s3, settings, "elsewhere/op_x/g2.jsonl")

    # To clean: objects with no record or a DELETED one, an upload with no record, an upload the
    # published record does not name, and a QUEUED operation whose wake-up was lost.
    no_record = [await put(s3, settings, "exports/op_gone/g1.jsonl"), await put(s3, settings, "exports/stray.txt")]
    await insert_operation(pool, "op_canceled", "CANCELED", generation=1)
    deleted_record = await put(s3, settings, await insert_artifact(pool, "op_canceled", 1, "DELETED"))
    stale_uploads = {
        await start_upload(s3, settings, "exports/op_gone/g2.jsonl"),
        await start_upload(s3, settings, published),
    }
    await insert_operation(pool, "op_lost", "QUEUED")
    await shift(pool, "op_lost", "updated_at", "-2 minutes")

    await wait_for(lambda: older_than_grace(s3, settings, GRACE_SECONDS), timeout=GRACE_SECONDS + 10)
    fresh = await put(s3, settings, "exports/op_fresh/g1.jsonl")
    before = counters()

    report = await janitor.run_pass()

    assert await all_keys(s3, settings) == {published, outside, fresh}
    assert await uploads(s3, settings) == {running_upload, outside_upload}
    woken = [row["operation_id"] for row in await pool.fetch("SELECT operation_id FROM outbox")]
    assert woken == ["op_lost"]
    records = dict(await pool.fetch("SELECT object_key, state FROM artifacts"))
    assert records == {published: "PUBLISHED", running_key: "WRITING", deleted_record: "DELETED"}
    assert (report.orphan_objects_removed, report.stale_uploads_aborted) == (len(no_record) + 1, len(stale_uploads))
    assert report.requeued == {"lease_expired": 0, "retry_due": 0, "message_lost": 1}
    moved(before, orphans=3, uploads=2, message_lost=1, passes_ok=1, pass_durations=1)


async def test_each_pass_lists_at_most_a_batch_and_the_next_one_goes_on_from_there(
    pool: asyncpg.Pool, s3: Any, settings: Settings
) -> None:
    await insert_operation(pool, "op_a", "SUCCEEDED", generation=1, result_key="exports/op_a/g1.jsonl")
    published = await put(s3, settings, await insert_artifact(pool, "op_a", 1, "PUBLISHED"))
    orphans = [await put(s3, settings, f"exports/op_{name}/g1.jsonl") for name in "bcde"]
    await wait_for(lambda: older_than_grace(s3, settings, GRACE_SECONDS), timeout=GRACE_SECONDS + 10)
    janitor = Janitor(
        pool=pool,
        s3=s3,
        settings=settings.model_copy(update={"janitor_orphan_grace_seconds": GRACE_SECONDS, "janitor_batch_size": 2}),
    )

    # Two keys a pass, in key order: a (published), b | c, d | e, the end | a again.
    removed = [(await janitor.run_pass()).orphan_objects_removed for _ in range(4)]

    assert removed == [1, 2, 1, 0]
    assert await all_keys(s3, settings) == {published}
    assert len(orphans) == sum(removed)


async def test_each_step_counts_what_it_did(janitor: Janitor, pool: asyncpg.Pool, s3: Any, settings: Settings) -> None:
    old = await pool.fetchval("SELECT now() - interval '1 minute'")
    # An expired result, an abandoned cancellation, three stranded operations.
    await insert_operation(pool, "op_expiring", "SUCCEEDED", generation=1, result_key="exports/op_expiring/g1.jsonl")
    await shift(pool, "op_expiring", "result_expires_at", "-1 second")
    await put(s3, settings, await insert_artifact(pool, "op_expiring", 1, "PUBLISHED"))
    await insert_operation(pool, "op_cancel", "CANCEL_REQUESTED", generation=1)
    await insert_operation(pool, "op_lease", "RUNNING", generation=1)
    await shift(pool, "op_lease", "lease_expires_at", "-1 second")
    await insert_operation(pool, "op_retry", "RETRY_AT", generation=1)
    await shift(pool, "op_retry", "retry_at", "-1 second")
    await insert_operation(pool, "op_lost", "QUEUED")
    await shift(pool, "op_lost", "updated_at", "-2 minutes")
    # Stale records: a superseded attempt's upload, a failed attempt's complete object, a removal that died
    # halfway, and an expired result whose deletion failed (not left behind by an attempt).
    await insert_operation(pool, "op_taken", "RUNNING", generation=2)
    await shift(pool, "op_taken", "lease_expires_at", "1 minute")
    await insert_artifact(pool, "op_taken", 1, "WRITING", updated_at=old)
    await insert_operation(pool, "op_failed", "FAILED", generation=1)
    await put(s3, settings, await insert_artifact(pool, "op_failed", 1, "COMPLETE", updated_at=old))
    await put(s3, settings, await insert_artifact(pool, "op_failed", 0, "REMOVING", updated_at=old))
    await insert_operation(pool, "op_expired", "EXPIRED", generation=1)
    await put(s3, settings, await insert_artifact(pool, "op_expired", 1, "PUBLISHED", updated_at=old))
    # A record past its retention.
    await insert_operation(pool, "op_ancient", "CANCELED")
    await shift(pool, "op_ancient", "created_at", "-31 days")
    before = counters()

    report = await janitor.run_pass()

    assert report.expired == 1
    assert report.requeued == {"lease_expired": 1, "retry_due": 1, "message_lost": 1}
    assert report.cancellations_finished == 1
    assert (report.stale_artifacts_removed, report.unknown_state_artifacts) == (4, 3)
    assert report.purged == 1
    assert await keys(s3, settings) == set()
    assert set(await pool.fetchval("SELECT array_agg(DISTINCT state) FROM artifacts")) == {"DELETED"}
    moved(
        before,
        expired=1,
        lease_expired=1,
        retry_due=1,
        message_lost=1,
        canceled=1,
        stale=4,
        unknown_writing=1,
        unknown_complete=1,
        unknown_removing=1,
        purged=1,
        passes_ok=1,
        pass_durations=1,
    )


async def test_a_failed_pass_is_counted_as_failed(janitor: Janitor, pool: asyncpg.Pool) -> None:
    before = counters()
    await pool.execute("DROP TABLE outbox")

    with pytest.raises(asyncpg.UndefinedTableError):
        await janitor.run_pass()

    moved(before, passes_failed=1, pass_durations=1)


async def test_observe_system_sets_every_state_and_the_outbox_backlog(pool: asyncpg.Pool) -> None:
    ages = {"op_q_old": "-2 minutes", "op_q_new": "0 seconds", "op_run": "-30 seconds", "op_repair": "-10 minutes"}
    states = {"op_q_old": "QUEUED", "op_q_new": "QUEUED", "op_run": "RUNNING", "op_repair": "FAILED_REPAIR"}
    for operation_id, state in {**states, "op_done": "SUCCEEDED"}.items():
        await insert_operation(pool, operation_id, state)
    for operation_id, age in ages.items():
        await shift(pool, operation_id, "updated_at", age)
    # A retry's row, written long ago but due only in a minute, is backlog but has not waited yet.
    await pool.execute(
        "INSERT INTO outbox (operation_id, routing_key, payload, created_at, not_before, published_at) VALUES"
        " ('op_q_old', 'k', '{}', now() - interval '5 minutes', now() - interval '5 minutes', NULL),"
        " ('op_q_new', 'k', '{}', now(), now(), NULL),"
        " ('op_run', 'k', '{}', now() - interval '20 minutes', now() + interval '1 minute', NULL),"
        " ('op_done', 'k', '{}', now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour')"
    )

    await observe_system(pool)

    counts = {state.value: gauge("chatexport_operations", state=state.value) for state in State}
    expected = {state.value: 0.0 for state in State} | {"QUEUED": 2, "RUNNING": 1, "FAILED_REPAIR": 1, "SUCCEEDED": 1}
    assert counts == expected
    oldest = {state: gauge("chatexport_operation_oldest_age_seconds", state=state) for state in WAITING_STATES}
    assert oldest["RETRY_AT"] == oldest["CANCEL_REQUESTED"] == 0
    for state, seconds in {"QUEUED": 120, "RUNNING": 30, "FAILED_REPAIR": 600}.items():
        assert seconds <= (oldest[state] or 0) < seconds + 10, state
    assert gauge("chatexport_outbox_backlog") == 3
    assert 300 <= (gauge("chatexport_outbox_oldest_age_seconds") or 0) < 310


async def test_observe_system_reports_zeros_on_an_empty_database(pool: asyncpg.Pool) -> None:
    await observe_system(pool)

    assert {gauge("chatexport_operations", state=state.value) for state in State} == {0}
    assert {gauge("chatexport_operation_oldest_age_seconds", state=state) for state in WAITING_STATES} == {0}
    assert gauge("chatexport_outbox_backlog") == gauge("chatexport_outbox_oldest_age_seconds") == 0


async def test_a_key_the_batch_delete_refuses_does_not_keep_the_other_orphans(
    janitor: Janitor, s3: Any, settings: Settings
) -> None:
    odd = await put(s3, settings, "exports/op_odd/ctrl\x01key")
    orphans = {await put(s3, settings, f"exports/op_gone/g{generation}.jsonl") for generation in (1, 2)}
    await wait_for(lambda: older_than_grace(s3, settings, GRACE_SECONDS), timeout=GRACE_SECONDS + 10)

    removed = await janitor.remove_orphan_objects()

    assert orphans.isdisjoint(await all_keys(s3, settings))
    assert removed == len(orphans) + (odd not in await all_keys(s3, settings))


async def test_a_split_artifacts_record_names_every_part_under_its_folder(
    janitor: Janitor, pool: asyncpg.Pool, s3: Any, settings: Settings
) -> None:
    await insert_operation(pool, "op_split", "SUCCEEDED", generation=1, result_key="exports/op_split/g1/")
    await pool.execute(
        "INSERT INTO artifacts (operation_id, generation, object_key, state) VALUES"
        " ('op_split', 1, 'exports/op_split/g1/', 'PUBLISHED'), ('op_split', 2, 'exports/op_split/g2/', 'DELETED')"
    )
    await insert_operation(pool, "op_writing", "RUNNING", generation=1)
    await shift(pool, "op_writing", "lease_expires_at", "1 minute")
    await pool.execute(
        "INSERT INTO artifacts (operation_id, generation, object_key, state)"
        " VALUES ('op_writing', 1, 'exports/op_writing/g1/', 'WRITING')"
    )
    published = {await put(s3, settings, f"exports/op_split/g1/part-{n}.csv") for n in (1, 2)}
    writing = await put(s3, settings, "exports/op_writing/g1/part-1.csv")
    writing_upload = await start_upload(s3, settings, "exports/op_writing/g1/part-2.csv")
    # Under a DELETED record's folder, and under a folder that only looks like one (its record is one file).
    orphans = {
        await put(s3, settings, "exports/op_split/g2/part-1.csv"),
        await put(s3, settings, "exports/op_split/g1.csv/part-1.csv"),
    }
    stale_upload = await start_upload(s3, settings, "exports/op_split/g2/part-2.csv")
    await wait_for(lambda: older_than_grace(s3, settings, GRACE_SECONDS), timeout=GRACE_SECONDS + 10)
    before = counters()

    await janitor.run_pass()

    assert await all_keys(s3, settings) == published | {writing}
    assert await uploads(s3, settings) == {writing_upload}
    assert orphans.isdisjoint(await all_keys(s3, settings))
    assert stale_upload not in await uploads(s3, settings)
    moved(before, orphans=2, uploads=1, passes_ok=1, pass_durations=1)
