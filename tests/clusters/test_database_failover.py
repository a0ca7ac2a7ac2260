"""A database failover on a local primary with a standby (docs/deploy.md: A primary with standbys): every
session moves to the promoted standby by itself, a session on a server that takes no writes is discarded at
its first write, and a submit whose commit could not wait for the synchronous standby answers 503, never 202.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from devtools.clusters import PostgresCluster
from devtools.moto import MotoServer
from devtools.servers import PrivatePostgres
from services.api.app import init_app
from services.api.exporting.changes import CHANNEL, OperationChanges
from services.janitor.main import _lead
from shared.auth import mint_token
from shared.db import TRANSIENT_DATABASE_ERRORS, ReadOnlyServer, connect, create_pool
from shared.migrator import migrate
from shared.settings import Settings
from tests.support import make_settings, wait_for
from tests.support.api_calls import make_conversation, submit

DATABASE = "failover"
FAILOVER_TIMEOUT_SECONDS = 60.0

OPERATIONS = "SELECT count(*) FROM operations"

MakeCluster = Callable[..., Awaitable[PostgresCluster]]


def cluster_settings(database_url: str, **overrides: Any) -> Settings:
    """Settings on ``database_url`` with a short connect timeout per host; nothing else is used here."""
    return Settings(database_url=database_url, database_connect_timeout_seconds=2.0, **overrides)


async def count(server: PrivatePostgres, sql: str) -> int:
    """The number ``sql`` (a ``SELECT count(*)``) answers in the test's database on ``server`` alone."""
    conn = await asyncpg.connect(server.url(DATABASE))
    try:
        found: int = await conn.fetchval(sql)
        return found
    finally:
        await conn.close()


async def port_of_primary(pool: asyncpg.Pool) -> int | None:
    """The port of the server that took a write through ``pool``; None while no write gets through."""
    try:
        async with pool.acquire() as conn:
            await conn.execute("INSERT INTO notes DEFAULT VALUES")
            port: int = await conn.fetchval("SELECT inet_server_port()")
            return port
    except TRANSIENT_DATABASE_ERRORS:
        return None


async def fail_over(cluster: PostgresCluster) -> PrivatePostgres:
    """Stop the primary as a crash would, promote the standby and return it."""
    standby = cluster.standbys[0]
    await asyncio.to_thread(cluster.primary.stop, "immediate")
    await asyncio.to_thread(cluster.promote, standby)
    return standby


async def test_every_session_moves_to_the_promoted_standby_by_itself(make_postgres_cluster: MakeCluster) -> None:
    cluster = await make_postgres_cluster()
    settings = cluster_settings(await cluster.create_database(DATABASE))
    pool = await create_pool(settings, min_size=2)
    changes = OperationChanges(settings)
    leader = None
    try:
        await pool.execute("CREATE TABLE notes (id bigserial PRIMARY KEY)")
        assert await port_of_primary(pool) == cluster.primary.port
        # Replication is asynchronous: the table must have reached the standby before the crash.
        await wait_for(lambda: replayed(cluster.standbys[0], "SELECT 1 FROM notes"), timeout=FAILOVER_TIMEOUT_SECONDS)
        await changes.start()
        await wait_for(lambda: changes.connected, timeout=FAILOVER_TIMEOUT_SECONDS)
        leader = await _lead(settings, None)
        assert leader is not None

        promoted = await fail_over(cluster)

        # The pool's connections died with the primary; the next ones find the promoted standby.
        assert await wait_for(lambda: port_of_primary(pool), timeout=FAILOVER_TIMEOUT_SECONDS) == promoted.port
        # The janitor's lock session died too: it leads again, from the new primary.
        leader = await wait_for(lambda: _lead(settings, leader), timeout=FAILOVER_TIMEOUT_SECONDS)
        assert await leader.fetchval("SELECT inet_server_port()") == promoted.port
        # The change listener listens on the new primary: what is announced there reaches a waiter.
        with changes.subscribe("op-1") as subscription:

            async def announced() -> bool:
                await pool.execute("SELECT pg_notify($1, 'op-1 7 RUNNING')", CHANNEL)
                return await subscription.wait(0.5) and subscription.latest is not None

            await wait_for(announced, timeout=FAILOVER_TIMEOUT_SECONDS)
            assert subscription.latest is not None and subscription.latest.version == 7
    finally:
        if leader is not None:
            leader.terminate()
        await changes.close()
        await pool.close()


async def replayed(standby: PrivatePostgres, sql: str) -> bool:
    """True once ``sql`` runs in the test's database on ``standby``: the standby has replayed what it needs."""
    try:
        await count(standby, sql)
    except (asyncpg.InvalidCatalogNameError, asyncpg.UndefinedTableError):
        return False
    return True


async def backend_gone(server_url: str, backend: int) -> bool:
    conn = await asyncpg.connect(server_url)
    try:
        return not await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", backend)
    finally:
        await conn.close()


async def test_a_session_opened_on_a_standby_is_discarded_at_its_first_write(
    make_postgres_cluster: MakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = await make_postgres_cluster()
    await cluster.create_database(DATABASE)
    standby = cluster.standbys[0]
    # The standby's own URL, without target_session_attrs: as a DNS name left on the old primary would be.
    settings = cluster_settings(cluster.server_url(standby, DATABASE))
    await wait_for(lambda: replayed(standby, "SELECT 1"), timeout=FAILOVER_TIMEOUT_SECONDS)
    # A part's writing pool opens no session there at all (docs/operations.md: A database that takes no writes).
    with pytest.raises(ReadOnlyServer, match="standby"):
        await create_pool(settings)
    # A pool that only reads does; should such a session meet a write, it is discarded at once.
    pool = await create_pool(settings, writable=False)
    try:
        async with pool.acquire() as conn:
            backend = await conn.fetchval("SELECT pg_backend_pid()")
            assert await conn.fetchval("SELECT 1") == 1  # reads pass on a standby
            try:
                await conn.execute("CREATE TABLE notes (id int)")
            except asyncpg.ReadOnlySQLTransactionError as refused:
                assert isinstance(refused, TRANSIENT_DATABASE_ERRORS)
            else:
                raise AssertionError("a standby took a write")
        await wait_for(lambda: backend_gone(standby.url(DATABASE), backend), timeout=10)
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") != backend
    finally:
        await pool.close()

    # LISTEN is refused on a standby (25006): the relay's listener connection is dropped, not kept.
    listener = await connect(settings)
    with contextlib.suppress(asyncpg.ReadOnlySQLTransactionError):
        await listener.add_listener(CHANNEL, lambda *_: None)
    await wait_for(listener.is_closed, timeout=10)
    # The api's change listener keeps its session while nobody waits, so it opens none on a standby at all.
    changes = OperationChanges(settings)
    with caplog.at_level(logging.WARNING, logger="services.api.exporting.changes"):
        await changes.start()
        try:
            await wait_for(lambda: any(getattr(r, "error", None) == "ReadOnlyServer" for r in caplog.records))
            assert not changes.connected
        finally:
            await changes.close()
    # A standby grants advisory locks, but a janitor never leads from one.
    assert await _lead(settings, None) is None


@contextlib.asynccontextmanager
async def in_process_api(settings: Settings) -> AsyncIterator[TestClient[Any, Any]]:
    client: TestClient[Any, Any] = TestClient(TestServer(init_app(settings)))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def cancel_commit_wait(primary: PrivatePostgres) -> None:
    """Cancel (``pg_cancel_backend``) the one backend whose commit waits for the synchronous standby."""

    async def waiting() -> int | None:
        conn = await asyncpg.connect(primary.url())
        try:
            pid: int | None = await conn.fetchval("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
            if pid is not None:
                assert await conn.fetchval("SELECT pg_cancel_backend($1)", pid)
            return pid
        finally:
            await conn.close()

    await wait_for(waiting, timeout=FAILOVER_TIMEOUT_SECONDS)


async def test_a_submit_whose_commit_did_not_reach_the_synchronous_standby_answers_503_until_it_has(
    make_postgres_cluster: MakeCluster, moto: MotoServer
) -> None:
    cluster = await make_postgres_cluster(synchronous=True)
    database_url = await cluster.create_database(DATABASE)
    await migrate(database_url)
    # The statement timeout outlasts the test's own cancel: the commit's wait ends only by that cancel.
    settings = make_settings(
        database_url, moto.endpoint_url, database_connect_timeout_seconds=2.0, database_timeout_seconds=120.0
    )

    def auth(user_id: str, *, admin: bool = False) -> dict[str, str]:
        token = mint_token(settings, user_id=user_id, scopes=["admin"] if admin else None)
        return {"Authorization": f"Bearer {token}"}

    standby = cluster.standbys[0]
    async with in_process_api(settings) as api:
        await make_conversation(api, auth, "c-a", ["alice"])
        await asyncio.to_thread(standby.stop)

        async def submit_cancelled() -> tuple[int, dict[str, Any]]:
            answer = asyncio.create_task(submit(api, auth, "alice", "c-a", {"format": "jsonl"}, "sync-1"))
            await cancel_commit_wait(cluster.primary)
            response = await answer
            return response.status, await response.json()

        # The first submit commits on the primary only; its replay waits for the standby as well.
        for _attempt in ("create", "replay"):
            status, problem = await submit_cancelled()
            assert (status, problem["code"]) == (503, "SERVICE_UNAVAILABLE"), problem
        assert await count(cluster.primary, OPERATIONS) == 1  # committed locally all the same

        await asyncio.to_thread(standby.start)
        response = await submit(api, auth, "alice", "c-a", {"format": "jsonl"}, "sync-1")
        assert response.status == 202, await response.text()
        assert response.headers["Idempotent-Replayed"] == "true"

        # The same for a cancel: the first commits on the primary only, and its repeat, which changes
        # nothing, still waits for the standby before it may answer 202.
        cancel_path = f"/v3/operations/{(await response.json())['operation_id']}/cancel"
        await asyncio.to_thread(standby.stop)

        async def cancel_cancelled() -> int:
            answer = asyncio.create_task(api.post(cancel_path, headers=auth("alice")))
            await cancel_commit_wait(cluster.primary)
            return (await answer).status

        assert [await cancel_cancelled(), await cancel_cancelled()] == [503, 503]
        await asyncio.to_thread(standby.start)
        assert (await api.post(cancel_path, headers=auth("alice"))).status == 202
    # Flushed on the standby before the 202; replayed there soon after.
    assert await wait_for(lambda: count(standby, OPERATIONS), timeout=FAILOVER_TIMEOUT_SECONDS) == 1
    assert await count(cluster.primary, OPERATIONS) == 1
