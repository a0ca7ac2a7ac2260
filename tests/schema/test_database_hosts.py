"""Connections to a database URL that names several hosts, and sessions that find themselves on a server
that takes no writes (docs/deploy.md: A primary with standbys), on the shared server: a host that never
answers stands in for a dead primary, ``default_transaction_read_only`` for a standby or a demoted primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg
import pytest

from services.janitor import leadership
from services.janitor.main import _lead
from shared.db import TRANSIENT_DATABASE_ERRORS, ReadOnlyServer, connect, create_pool, open_connection, split_hosts
from shared.settings import Settings
from tests.support import admin_execute, wait_for

CONNECT_TIMEOUT_SECONDS = 1.0


def test_a_url_with_several_hosts_gives_one_url_per_host_in_order_with_everything_else_kept() -> None:
    url = "postgresql://app:p%40ss@db1:5432,[::1]:5433,db3/chatexport?target_session_attrs=read-write"
    assert split_hosts(url) == [
        ("db1:5432", "postgresql://app:p%40ss@db1:5432/chatexport?target_session_attrs=read-write"),
        ("[::1]:5433", "postgresql://app:p%40ss@[::1]:5433/chatexport?target_session_attrs=read-write"),
        ("db3", "postgresql://app:p%40ss@db3/chatexport?target_session_attrs=read-write"),
    ]


@pytest.mark.parametrize(
    "url",
    ["postgresql://postgres@127.0.0.1:5432/chatexport", "postgresql://db/chatexport", "postgresql:///chatexport"],
)
def test_a_url_with_one_host_or_none_comes_back_unchanged(url: str) -> None:
    assert [dsn for _host, dsn in split_hosts(url)] == [url]


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """A port that accepts TCP connections and never says a word: a black-holed database host."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


def closed_port() -> int:
    """A port nothing listens on (bound, then released): connecting is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def with_hosts(database_url: str, *hosts: str, query: str = "") -> str:
    """``database_url`` with its host replaced by ``hosts``, in order, and ``query`` as its parameters."""
    parts = urlsplit(database_url)
    netloc = f"{parts.username}@{','.join(hosts)}"
    return parts._replace(netloc=netloc, query=query).geturl()


def patient(settings: Settings, database_url: str) -> Settings:
    """``settings`` on ``database_url``, each host given ``CONNECT_TIMEOUT_SECONDS`` and statements much longer."""
    return settings.model_copy(
        update={
            "database_url": database_url,
            "database_connect_timeout_seconds": CONNECT_TIMEOUT_SECONDS,
            "database_timeout_seconds": 30.0,
        }
    )


async def test_a_black_holed_first_host_costs_one_connect_timeout_and_the_second_host_answers(
    settings: Settings,
) -> None:
    real = urlsplit(settings.database_url).netloc.rpartition("@")[2]
    async with silent_server() as port:
        url = with_hosts(settings.database_url, f"127.0.0.1:{port}", real)
        # asyncpg alone spends its one timeout on the silent host and never tries the second.
        with pytest.raises(TimeoutError):
            await asyncpg.connect(url, timeout=CONNECT_TIMEOUT_SECONDS * 2)
        started = time.monotonic()
        pool = await create_pool(patient(settings, url))
        try:
            assert await pool.fetchval("SELECT 1") == 1
        finally:
            await pool.close()
        conn = await connect(patient(settings, url))
        try:
            assert await conn.fetchval("SELECT inet_server_port()") == int(real.rpartition(":")[2])
        finally:
            await conn.close()
    # One timeout for the pool's first connection, one for ``connect``: never the statement timeout.
    assert time.monotonic() - started < 4 * CONNECT_TIMEOUT_SECONDS + 10


async def test_a_single_silent_host_times_out_after_the_connect_timeout(settings: Settings) -> None:
    async with silent_server() as port:
        url = with_hosts(settings.database_url, f"127.0.0.1:{port}")
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await connect(patient(settings, url))
        assert CONNECT_TIMEOUT_SECONDS <= time.monotonic() - started < CONNECT_TIMEOUT_SECONDS + 10


async def test_when_no_host_answers_the_last_hosts_error_is_raised(settings: Settings) -> None:
    async with silent_server() as port:
        url = with_hosts(settings.database_url, f"127.0.0.1:{port}", f"127.0.0.1:{closed_port()}")
        with pytest.raises(ConnectionRefusedError):
            await connect(patient(settings, url))


async def test_a_read_write_url_skips_a_host_that_takes_no_writes(settings: Settings) -> None:
    real = urlsplit(settings.database_url).netloc.rpartition("@")[2]
    url = with_hosts(settings.database_url, real, query="target_session_attrs=read-write")
    read_only = {"default_transaction_read_only": "on"}
    with pytest.raises(asyncpg.TargetServerAttributeNotMatched) as refused:
        await open_connection(url, server_settings=read_only)
    assert isinstance(refused.value, TRANSIENT_DATABASE_ERRORS)
    conn = await open_connection(url)
    try:
        assert await conn.fetchval("SHOW transaction_read_only") == "off"
    finally:
        await conn.close()


async def read_only_database(database_url: str, on: bool) -> None:
    """Make the sessions opened from now on in ``database_url``'s database read-only (as on a standby), or
    writable again.
    """
    name = urlsplit(database_url).path.lstrip("/")
    setting = "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
    await admin_execute(f'ALTER DATABASE "{name}" {setting}')


async def backend_gone(settings: Settings, backend: int) -> bool:
    """True once no session of the server has the process id ``backend``."""
    conn = await asyncpg.connect(settings.database_url, server_settings={"default_transaction_read_only": "off"})
    try:
        return not await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", backend)
    finally:
        await conn.close()


async def backends(pool: asyncpg.Pool, count: int) -> set[int]:
    """The server process ids of ``count`` connections of ``pool`` held at once, each after a write."""
    held = [await pool.acquire() for _ in range(count)]
    try:
        for conn in held:
            await conn.execute("CREATE TEMPORARY TABLE written (n int) ON COMMIT DROP")
        return {await conn.fetchval("SELECT pg_backend_pid()") for conn in held}
    finally:
        for conn in held:
            await pool.release(conn)


async def test_a_pooled_connection_that_meets_a_read_only_server_is_discarded_with_its_pool(
    settings: Settings,
) -> None:
    real = urlsplit(settings.database_url).netloc.rpartition("@")[2]
    url = with_hosts(settings.database_url, real, query="target_session_attrs=read-write")
    pool = await create_pool(patient(settings, url).model_copy(update={"database_pool_max": 3}), min_size=3)
    try:
        before = await backends(pool, 3)
        async with pool.acquire() as conn:
            # What a demotion does to the sessions on a primary: from the next transaction on, no writes.
            await conn.execute("SET default_transaction_read_only = on")
            demoted = await conn.fetchval("SELECT pg_backend_pid()")
            with pytest.raises(asyncpg.ReadOnlySQLTransactionError) as refused:
                await conn.execute("CREATE TABLE written (n int)")
        assert isinstance(refused.value, TRANSIENT_DATABASE_ERRORS)
        await wait_for(lambda: backend_gone(settings, demoted), timeout=10)
        # The other sessions were on the same server: none of them is used again.
        assert not (await backends(pool, 3) & before)
    finally:
        await pool.close()


async def test_a_connection_of_its_own_that_meets_a_read_only_server_is_terminated(settings: Settings) -> None:
    conn = await connect(settings, default_transaction_read_only="on")
    lost = asyncio.Event()
    conn.add_termination_listener(lambda _conn: lost.set())
    with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
        await conn.execute("CREATE TABLE written (n int)")
    await asyncio.wait_for(lost.wait(), timeout=10)
    assert conn.is_closed()


async def test_the_janitor_does_not_lead_from_a_session_that_takes_no_writes(settings: Settings) -> None:
    await read_only_database(settings.database_url, True)
    try:
        assert await _lead(settings, None) is None
        conn = await connect(settings)
        try:
            with pytest.raises(ReadOnlyServer):
                await leadership.try_lead(conn)
            held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
            assert await conn.fetchval(held) == 0
        finally:
            await conn.close()
    finally:
        await read_only_database(settings.database_url, False)


async def test_a_leader_whose_server_stops_taking_writes_gives_up_its_session(settings: Settings) -> None:
    leader = await _lead(settings, None)
    assert leader is not None
    successor = None
    try:
        assert await _lead(settings, leader) == leader  # the same session, still leading
        # What a demotion does to every open session: from the next transaction on, nothing may write.
        await leader.execute("SET default_transaction_read_only = on")
        # The session is dropped with its lock, and a new one (on a server that takes writes) leads.
        successor = await _lead(settings, leader)
        assert leader.is_closed()
        assert successor is not None and successor is not leader
    finally:
        leader.terminate()
        if successor is not None:
            await successor.close()
