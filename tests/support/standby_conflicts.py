"""Exports read on a hot standby while the primary keeps the standby's reads in conflict (docs/development.md:
Development, Disturbed standby exports): a private primary with one standby that cancels a conflicting read
after ``max_standby_streaming_delay``, a conversation of many messages, and on the primary, every 0.2 s during
the exports, inserts, updates and deletes of another conversation's messages and a ``VACUUM`` of the table. The
janitor lists the bucket every 0.5 s meanwhile, as the fault tests' parts run it.

``python -m tests.support.standby_conflicts`` replays the whole setup (a million messages, long range reads, one
PutObject per file) and prints each export's outcome; the cluster group runs a small one
(``tests/clusters/test_standby_reads.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from devtools.clusters import PostgresCluster
from devtools.servers import PrivatePostgres
from shared.migrator import migrate
from shared.settings import Settings
from tests.support import AMQP_URL, wait_for
from tests.support.fault_harness import FAST, Faulty, running

DISTURB_EVERY_SECONDS = 0.2
# The read of the standby cancelled after this long in conflict (the standby's max_standby_streaming_delay).
STANDBY_DELAY = "1s"


@dataclass(frozen=True)
class Outcome:
    """One export: its terminal ``state``, the ``attempt`` that ended it, the ``error_code`` of its last failed
    attempt (None when none failed), and its message count.
    """

    state: str
    attempt: int
    error_code: str | None
    messages: int | None


async def migrated(cluster: PostgresCluster, dbname: str) -> str:
    """The URL of a new, migrated database ``dbname`` on ``cluster``."""
    database_url = await cluster.create_database(dbname)
    await migrate(database_url)
    return database_url


async def replayed(cluster: PostgresCluster, standby: PrivatePostgres) -> bool:
    """True once ``standby`` has replayed everything its primary has written so far."""
    written = await fetchval_on(cluster.server_url(cluster.primary, "postgres"), "SELECT pg_current_wal_lsn()")
    replayed_up_to = await fetchval_on(cluster.server_url(standby, "postgres"), "SELECT pg_last_wal_replay_lsn()")
    return bool(replayed_up_to >= written)


async def fetchval_on(url: str, sql: str) -> Any:
    """The first value of ``sql``'s first row, on a connection of its own to ``url``."""
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


async def prepared(
    cluster: PostgresCluster, *, messages: int, body_bytes: int, standby_delay: str = STANDBY_DELAY
) -> str:
    """A migrated database ``chatexport`` on ``cluster`` with c-big (alice, ``messages`` messages of
    ``body_bytes``) and c-churn, replayed on the standby, whose conflicting reads are cancelled after
    ``standby_delay``; its primary URL.
    """
    database_url = await migrated(cluster, "chatexport")
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO conversations (conversation_id, last_seq) VALUES ('c-big', $1), ('c-churn', 0)", messages
        )
        await conn.execute("INSERT INTO conversation_members (conversation_id, user_id) VALUES ('c-big', 'alice')")
        await conn.execute(
            "INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at)"
            " SELECT 'c-big', n, 'm' || n, 'alice', left(repeat(md5(n::text), $2 / 32 + 1), $2),"
            " timestamptz '2026-01-01Z' + n * interval '1 s' FROM generate_series(1, $1::bigint) AS n",
            messages,
            body_bytes,
        )
    finally:
        await conn.close()
    standby = cluster.standbys[0]
    admin = await asyncpg.connect(cluster.server_url(standby, "postgres"))
    try:
        await admin.execute(f"ALTER SYSTEM SET max_standby_streaming_delay = '{standby_delay}'")
        await admin.execute("SELECT pg_reload_conf()")
    finally:
        await admin.close()

    await wait_for(lambda: replayed(cluster, standby), timeout=300)
    return database_url


@contextlib.asynccontextmanager
async def disturbed(database_url: str) -> AsyncIterator[None]:
    """While inside: every ``DISTURB_EVERY_SECONDS``, c-churn gets messages inserted, updated and deleted on the
    primary, and ``VACUUM messages`` removes the dead rows, whose removal conflicts with the standby's reads.
    """
    conn = await asyncpg.connect(database_url)

    async def churn() -> None:
        seq = 0
        while True:
            seq += 100
            await conn.execute(
                "INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at)"
                " SELECT 'c-churn', n, 'c' || n, 'bob', 'churn', now() FROM generate_series($1::bigint - 99, $1) AS n",
                seq,
            )
            await conn.execute(
                "UPDATE messages SET body = 'changed' WHERE conversation_id = 'c-churn' AND seq > $1", seq - 50
            )
            await conn.execute("DELETE FROM messages WHERE conversation_id = 'c-churn'")
            await conn.execute("VACUUM messages")
            await asyncio.sleep(DISTURB_EVERY_SECONDS)  # the load's own pace, not a wait for a condition

    task = asyncio.create_task(churn())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await conn.close()


@contextlib.asynccontextmanager
async def standby_system(
    cluster: PostgresCluster, database_url: str, log_dir: Path, overrides: Mapping[str, str]
) -> AsyncIterator[Faulty]:
    """The parts (one worker) on ``database_url``, reading exports on the cluster's standby."""
    reads = {
        "CHATEXPORT_DATABASE_READ_URL": cluster.server_url(cluster.standbys[0], "chatexport"),
        # Attempts may run long under the load: give each a lease that outlasts a slow range.
        "CHATEXPORT_LEASE_SECONDS": "30",
        "CHATEXPORT_HEARTBEAT_SECONDS": "3",
        **overrides,
    }
    async with running(log_dir, database_url=database_url, amqp_url=AMQP_URL, workers=1, overrides=reads) as faulty:
        yield faulty


async def worker_reads(faulty: Faulty) -> dict[str, float]:
    """``chatexport_worker_export_reads_total`` and ``..._standby_fallbacks_total`` summed over the workers."""
    totals: dict[str, float] = {}
    for part in faulty.system.metrics_ports:
        if part.startswith("worker"):
            for name, value in (await faulty.metrics(part)).items():
                if "export_reads_total{" in name or "standby_fallbacks_total{" in name:
                    totals[name] = totals.get(name, 0.0) + value
    return totals


async def export_once(faulty: Faulty, key: str, *, timeout: float) -> Outcome:
    """Export c-big as alice under ``key`` and wait until it ends."""
    operation_id = await faulty.submit("alice", "c-big", key)
    row = await faulty.wait_state(operation_id, "SUCCEEDED", "FAILED", "FAILED_REPAIR", "CANCELED", timeout=timeout)
    failures = await faulty.pool.fetchval(
        "SELECT error_code FROM attempts WHERE operation_id = $1 AND error_code IS NOT NULL"
        " ORDER BY generation DESC LIMIT 1",
        operation_id,
    )
    return Outcome(row["state"], row["attempt"], failures, row["result_message_count"])


async def replay(*, exports: int, messages: int, body_bytes: int, overrides: Mapping[str, str]) -> list[Outcome]:
    """The whole setup on a cluster of its own: ``exports`` disturbed exports, one after the other."""
    with tempfile.TemporaryDirectory(prefix="chatexport-standby-conflicts-") as folder:
        cluster = PostgresCluster(standbys=1)
        try:
            cluster.start()
            database_url = await prepared(cluster, messages=messages, body_bytes=body_bytes)
            outcomes: list[Outcome] = []
            async with (
                standby_system(cluster, database_url, Path(folder), overrides) as faulty,
                disturbed(database_url),
            ):
                for number in range(1, exports + 1):
                    outcome = await export_once(faulty, f"replay-{number}", timeout=1800)
                    print(f"export {number}: {outcome}", flush=True)
                    outcomes.append(outcome)
                print(f"the workers' reads: {await worker_reads(faulty)}", flush=True)
            return outcomes
        finally:
            cluster.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exports", type=int, default=20)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body-bytes", type=int, default=100)
    args = parser.parse_args()
    # The parts at their defaults, as a deployment runs them, but for the janitor's fast passes (which list the
    # bucket all the more often) and the setup's long ranges and large parts.
    defaults = {
        key: str(Settings.model_fields[key.removeprefix("CHATEXPORT_").lower()].default)
        for key in FAST
        if not key.startswith("CHATEXPORT_JANITOR_")
    }
    overrides = {
        **defaults,
        "CHATEXPORT_EXPORT_BATCH_ROWS": "1000000",
        "CHATEXPORT_S3_PART_SIZE_BYTES": str(256 * 1024 * 1024),
    }
    outcomes = asyncio.run(
        replay(exports=args.exports, messages=args.messages, body_bytes=args.body_bytes, overrides=overrides)
    )
    differ = sum(1 for outcome in outcomes if outcome.error_code == "STORED_BYTES_DIFFER")
    first_time = sum(1 for outcome in outcomes if outcome.state == "SUCCEEDED" and outcome.attempt == 1)
    print(f"{len(outcomes)} exports: {first_time} succeeded at their first attempt, {differ} had stored bytes differ")
    raise SystemExit(0 if differ == 0 and first_time == len(outcomes) else 1)


if __name__ == "__main__":
    main()
