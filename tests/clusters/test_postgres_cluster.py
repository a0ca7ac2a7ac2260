"""The local PostgreSQL cluster (devtools/clusters.py): a standby replays the primary's writes, a promoted
standby takes writes, and paused replay holds back what the primary commits until it is resumed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from devtools.clusters import PostgresCluster
from devtools.servers import PrivatePostgres
from tests.support import wait_for

DATABASE = "clustered"
COMMIT_TIMEOUT_SECONDS = 30.0  # a commit waiting for a standby that never answers would hang without it


async def fetch(url: str, sql: str) -> object:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(sql, timeout=COMMIT_TIMEOUT_SECONDS)
    finally:
        await conn.close()


async def count_rows(cluster: PostgresCluster, server: PrivatePostgres) -> object:
    return await fetch(cluster.server_url(server, DATABASE), "SELECT count(*) FROM notes")


async def count_rows_are(cluster: PostgresCluster, server: PrivatePostgres, expected: int) -> bool:
    """True when ``server`` shows ``expected`` notes; False while it has not replayed the table yet."""
    try:
        return await count_rows(cluster, server) == expected
    except (asyncpg.InvalidCatalogNameError, asyncpg.UndefinedTableError):
        return False


async def make_notes(cluster: PostgresCluster) -> str:
    """Create the database with an empty ``notes`` table on the primary; return the cluster's URL of it."""
    url = await cluster.create_database(DATABASE)
    await fetch(url, "CREATE TABLE notes (body text)")
    return url


async def test_a_standby_replays_a_row_written_through_the_multi_host_url(postgres_cluster: PostgresCluster) -> None:
    url = await make_notes(postgres_cluster)
    assert await fetch(url, "SELECT inet_server_port()") == postgres_cluster.primary.port

    await fetch(url, "INSERT INTO notes VALUES ('hello') RETURNING 1")

    standby = postgres_cluster.standbys[0]
    await wait_for(lambda: count_rows_are(postgres_cluster, standby, 1))
    assert await fetch(postgres_cluster.server_url(standby, DATABASE), "SELECT body FROM notes") == "hello"


async def test_a_promoted_standby_takes_the_writes(postgres_cluster: PostgresCluster) -> None:
    await make_notes(postgres_cluster)
    old_primary, standby = postgres_cluster.primary, postgres_cluster.standbys[0]
    await wait_for(lambda: count_rows_are(postgres_cluster, standby, 0))
    with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
        await fetch(postgres_cluster.server_url(standby, DATABASE), "INSERT INTO notes VALUES ('early') RETURNING 1")

    await asyncio.to_thread(old_primary.stop)
    await asyncio.to_thread(postgres_cluster.promote, standby)

    assert postgres_cluster.primary is standby
    assert postgres_cluster.standbys == []
    assert postgres_cluster.former_primaries == [old_primary]
    url = postgres_cluster.database_url(DATABASE)
    assert await fetch(url, "INSERT INTO notes VALUES ('later') RETURNING inet_server_port()") == standby.port


async def test_paused_replay_hides_new_rows_until_resumed(postgres_cluster: PostgresCluster) -> None:
    url = await make_notes(postgres_cluster)
    standby = postgres_cluster.standbys[0]
    await fetch(url, "INSERT INTO notes VALUES ('before') RETURNING 1")
    await wait_for(lambda: count_rows_are(postgres_cluster, standby, 1))

    await asyncio.to_thread(postgres_cluster.pause_replay, standby)
    await fetch(url, "INSERT INTO notes VALUES ('during') RETURNING 1")
    written_at = await fetch(url, "SELECT pg_current_wal_insert_lsn()::text")  # past the INSERT's commit
    received = f"SELECT pg_last_wal_receive_lsn() >= '{written_at}'::pg_lsn"
    await wait_for(lambda: fetch(postgres_cluster.server_url(standby, DATABASE), received))

    assert await count_rows(postgres_cluster, standby) == 1  # received, not replayed
    await asyncio.to_thread(postgres_cluster.resume_replay, standby)
    await wait_for(lambda: count_rows_are(postgres_cluster, standby, 2))


async def test_synchronous_commits_go_on_after_a_promotion(
    make_postgres_cluster: Callable[..., Awaitable[PostgresCluster]],
) -> None:
    cluster = await make_postgres_cluster(2, synchronous=True)
    await make_notes(cluster)
    assert cluster.primary.query("SHOW synchronous_standby_names") == "ANY 1 (postgres2, postgres3)"
    promoted, follower = cluster.standbys
    await wait_for(lambda: count_rows_are(cluster, promoted, 0))

    await asyncio.to_thread(cluster.primary.stop, "immediate")
    await asyncio.to_thread(cluster.promote, promoted)

    assert promoted.query("SHOW synchronous_standby_names") == "ANY 1 (postgres3)"  # the follower moved over
    await fetch(cluster.database_url(DATABASE), "INSERT INTO notes VALUES ('after') RETURNING 1")
    await wait_for(lambda: count_rows_are(cluster, follower, 1))


async def test_a_promoted_lone_standby_requires_no_synchronous_standby(
    make_postgres_cluster: Callable[..., Awaitable[PostgresCluster]],
) -> None:
    cluster = await make_postgres_cluster(1, synchronous=True)
    await make_notes(cluster)
    standby = cluster.standbys[0]
    await wait_for(lambda: count_rows_are(cluster, standby, 0))

    await asyncio.to_thread(cluster.primary.stop, "immediate")
    await asyncio.to_thread(cluster.promote, standby)

    assert standby.query("SHOW synchronous_standby_names") == ""
    assert await fetch(cluster.database_url(DATABASE), "INSERT INTO notes VALUES ('alone') RETURNING 1") == 1
