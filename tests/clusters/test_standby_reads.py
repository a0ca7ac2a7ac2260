"""Export reads on a hot standby (docs/deploy.md: Export reads on a hot standby): a worker reads an export's
messages on the standby only once it has replayed past the claim, otherwise on the primary; a read the
standby cancels for a recovery conflict runs again on the primary. The real processes run against a private
primary with one standby.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest
from prometheus_client import REGISTRY

from devtools.clusters import PostgresCluster
from services.worker.writing.read_source import ReadSource
from tests.support import AMQP_URL, wait_for
from tests.support.fault_harness import check_ended_correctly, make_conversation, running
from tests.support.standby_conflicts import (
    Outcome,
    disturbed,
    export_once,
    fetchval_on,
    migrated,
    prepared,
    replayed,
    standby_system,
    worker_reads,
)

WAIT_SECONDS = 1.0
# Statements of the connection's database running pg_sleep on its server.
SLEEPING_READS_SQL = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND state = 'active' AND wait_event = 'PgSleep'"
)


async def test_an_export_never_reads_a_standby_that_has_not_replayed_its_claim(
    postgres_cluster: PostgresCluster, tmp_path: Path
) -> None:
    database_url = await migrated(postgres_cluster, "chatexport")
    standby = postgres_cluster.standbys[0]
    overrides = {
        "CHATEXPORT_DATABASE_READ_URL": postgres_cluster.server_url(standby, "chatexport"),
        "CHATEXPORT_DATABASE_READ_WAIT_SECONDS": str(WAIT_SECONDS),
    }
    async with running(tmp_path, database_url=database_url, amqp_url=AMQP_URL, overrides=overrides) as f:
        await asyncio.to_thread(postgres_cluster.pause_replay, standby)
        # Sent while replay is paused: the standby has none of these messages.
        await make_conversation(f, "c-replay", ["alice"], messages=300, body_bytes=40)
        expected = await f.expected("alice", "c-replay")
        fingerprint = await f.messages_fingerprint()
        while_paused = await f.submit("alice", "c-replay", "while-paused")
        await check_ended_correctly(f, "alice", {while_paused: expected}, fingerprint=fingerprint)
        paused_reads = await worker_reads(f)
        assert paused_reads["chatexport_worker_standby_fallbacks_total{reason=lag}"] == 1, paused_reads
        assert paused_reads["chatexport_worker_export_reads_total{server=primary}"] == 1, paused_reads
        assert paused_reads["chatexport_worker_export_reads_total{server=standby}"] == 0, paused_reads

        await asyncio.to_thread(postgres_cluster.resume_replay, standby)
        after_resume = await f.submit("alice", "c-replay", "after-resume")
        await check_ended_correctly(f, "alice", {after_resume: expected}, fingerprint=fingerprint)
        resumed_reads = await worker_reads(f)
        assert resumed_reads["chatexport_worker_export_reads_total{server=standby}"] == 1, resumed_reads
        assert resumed_reads["chatexport_worker_standby_fallbacks_total{reason=lag}"] == 1, resumed_reads


async def test_a_read_cancelled_by_a_recovery_conflict_runs_again_on_the_primary(
    postgres_cluster: PostgresCluster, caplog: pytest.LogCaptureFixture
) -> None:
    database_url = await migrated(postgres_cluster, "conflicts")
    standby = postgres_cluster.standbys[0]
    standby_url = postgres_cluster.server_url(standby, "conflicts")
    await wait_for(lambda: replayed(postgres_cluster, standby), timeout=30)
    admin = await asyncpg.connect(postgres_cluster.server_url(standby, "postgres"))
    try:  # cancel a conflicting query at once rather than after the default 30 s
        await admin.execute("ALTER SYSTEM SET max_standby_streaming_delay = 0")
        await admin.execute("SELECT pg_reload_conf()")
    finally:
        await admin.close()
    async with (
        asyncpg.create_pool(database_url, min_size=1, max_size=2) as primary,
        asyncpg.create_pool(standby_url, min_size=1, max_size=2) as standby_pool,
    ):
        reads = await ReadSource(primary=primary, standby=standby_pool, wait_seconds=30).begin()
        conflicts_before = conflicts()
        servers: list[bool] = []

        async def read(conn: asyncpg.Connection) -> bool:
            in_recovery: bool = await conn.fetchval("SELECT pg_is_in_recovery()")
            servers.append(in_recovery)
            if in_recovery:  # hold a lock on messages until the primary's exclusive lock is replayed
                await conn.fetchval("SELECT count(*) FROM messages, pg_sleep(60)")
            return in_recovery

        reading = asyncio.create_task(reads.run(read))
        # The lock is taken once the statement runs, not once it is sent: replayed between its prepare and its
        # run, the conflict ends the session, which asyncpg reports without the server's error
        # (docs/deploy.md: Export reads on a hot standby).
        await wait_for(lambda: fetchval_on(standby_url, SLEEPING_READS_SQL), timeout=30)
        async with primary.acquire() as conn, conn.transaction():
            await conn.execute("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        assert await asyncio.wait_for(reading, 60) is False  # the last run was on the primary
        assert servers == [True, False]
        assert conflicts() == conflicts_before + 1, moves(caplog)
        # The rest of this attempt's reads stay on the primary.
        assert await reads.run(read) is False
        assert servers == [True, False, False]


async def test_a_conflict_whose_session_ends_in_the_pool_s_reset_still_counts_as_a_conflict(
    postgres_cluster: PostgresCluster,
) -> None:
    """A standby that ends the session for a conflict can do so while the pool resets the connection after the
    cancelled read: the reset's error replaces the conflict's, and the fallback is still counted a conflict.
    """
    database_url = await migrated(postgres_cluster, "ended")
    standby = postgres_cluster.standbys[0]
    await wait_for(lambda: replayed(postgres_cluster, standby), timeout=30)

    async def session_ends(conn: asyncpg.Connection) -> None:
        await conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    async with (
        asyncpg.create_pool(database_url, min_size=1, max_size=2) as primary,
        asyncpg.create_pool(
            postgres_cluster.server_url(standby, "ended"), min_size=1, max_size=2, reset=session_ends
        ) as standby_pool,
    ):
        reads = await ReadSource(primary=primary, standby=standby_pool, wait_seconds=30).begin()
        conflicts_before = conflicts()
        servers: list[bool] = []

        async def read(conn: asyncpg.Connection) -> bool:
            in_recovery: bool = await conn.fetchval("SELECT pg_is_in_recovery()")
            servers.append(in_recovery)
            if in_recovery:  # the error a standby raises when it cancels a statement for a conflict
                await conn.execute("DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'serialization_failure'; END $$")
            return in_recovery

        assert await reads.run(read) is False
        assert servers == [True, False]
        assert conflicts() == conflicts_before + 1, fallbacks()


def moves(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """The reason and the error of every move of reads to the primary logged so far."""
    return [
        (getattr(record, "reason", "?"), getattr(record, "error", "?"))
        for record in caplog.records
        if record.getMessage() == "export reads moved to the primary"
    ]


def conflicts() -> float:
    return fallbacks().get("conflict", 0.0)


def fallbacks() -> dict[str, float]:
    """Every ``chatexport_worker_standby_fallbacks_total`` sample by reason."""
    return {
        sample.labels["reason"]: sample.value
        for metric in REGISTRY.collect()
        if metric.name == "chatexport_worker_standby_fallbacks"
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


MILLION = 1_000_000


async def tuples_returned(url: str) -> int:
    """``tup_returned`` of the database at ``url`` as its server counts it now."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        returned: int = await conn.fetchval(
            "SELECT tup_returned FROM pg_stat_database WHERE datname = current_database()"
        )
    finally:
        await conn.close()
    return returned


async def test_a_million_message_export_reads_the_standby_not_the_primary(
    postgres_cluster: PostgresCluster, tmp_path: Path
) -> None:
    database_url = await migrated(postgres_cluster, "chatexport")
    standby = postgres_cluster.standbys[0]
    primary_url = postgres_cluster.server_url(postgres_cluster.primary, "chatexport")
    conn = await asyncpg.connect(primary_url)
    try:
        await conn.execute("INSERT INTO conversations (conversation_id, last_seq) VALUES ('c-big', $1)", MILLION)
        await conn.execute("INSERT INTO conversation_members (conversation_id, user_id) VALUES ('c-big', 'alice')")
        await conn.execute(
            "INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at)"
            " SELECT 'c-big', n, 'm' || n, 'alice', md5(n::text), timestamptz '2026-01-01Z' + n * interval '1 s'"
            " FROM generate_series(1, $1::bigint) AS n",
            MILLION,
        )
    finally:
        await conn.close()
    await wait_for(lambda: replayed(postgres_cluster, standby), timeout=120)
    overrides = {"CHATEXPORT_DATABASE_READ_URL": postgres_cluster.server_url(standby, "chatexport")}
    async with running(tmp_path, database_url=database_url, amqp_url=AMQP_URL, workers=1, overrides=overrides) as f:
        before = await tuples_returned(primary_url)
        operation_id = await f.submit("alice", "c-big", "million")
        row = await f.wait_state(operation_id, "SUCCEEDED", timeout=300)
        grown = await tuples_returned(primary_url) - before
        print(f"\n1M export read on the standby: the primary returned {grown} tuples ({grown / MILLION:.2%})")
        assert row["result_message_count"] == MILLION
        assert grown < MILLION * 0.05
        reads = await worker_reads(f)
        assert reads["chatexport_worker_export_reads_total{server=standby}"] == 1, reads


async def test_exports_read_on_a_standby_kept_in_conflict_store_the_bytes_they_hashed(
    postgres_cluster: PostgresCluster, tmp_path: Path
) -> None:
    """A small run of the disturbed standby setup (``tests.support.standby_conflicts``): each file, about 40 MiB
    sent as one PutObject while the janitor lists the bucket, is stored as hashed at the first attempt.
    """
    messages = 60_000
    # A conflicting read is cancelled at once, so that the churn's VACUUMs move reads to the primary.
    database_url = await prepared(postgres_cluster, messages=messages, body_bytes=600, standby_delay="0")
    overrides = {
        "CHATEXPORT_EXPORT_BATCH_ROWS": str(messages),
        "CHATEXPORT_S3_PART_SIZE_BYTES": str(64 * 1024 * 1024),
        "CHATEXPORT_S3_TIMEOUT_SECONDS": "60",
        # The janitor's listings of the bucket, near back to back, meet each PutObject as it is stored.
        "CHATEXPORT_JANITOR_INTERVAL_SECONDS": "0.02",
    }
    async with standby_system(postgres_cluster, database_url, tmp_path, overrides) as faulty:
        async with disturbed(database_url):
            outcomes = [await export_once(faulty, f"disturbed-{number}", timeout=240) for number in (1, 2)]
        reads = await worker_reads(faulty)
    print(f"\ndisturbed standby exports: {outcomes}; reads {reads}")
    assert outcomes == [Outcome("SUCCEEDED", 1, None, messages)] * 2, (outcomes, reads)
    # The disturbance did what it is for: a standby read was cancelled and ran again on the primary.
    assert reads["chatexport_worker_standby_fallbacks_total{reason=conflict}"] >= 1, reads
