"""Smoke tests of the fault-injection tools: private servers keep their data across restarts and crashes,
and the TCP proxy cuts connections off, answers with an error, and lets them through again.
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aio_pika
import aiohttp
import asyncpg
import pytest
from aio_pika.abc import FieldValue

from devtools.moto import MotoServer
from devtools.servers import PrivatePostgres, PrivateRabbitMQ, TcpProxy, epmd_names
from tests.support import wait_for
from tests.support.fault_harness import wait_for_queue_counts

pytestmark = pytest.mark.e2e

# What a client of a server that went away sees, depending on where in the exchange it was.
CONNECTION_LOST = (OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError, asyncpg.AdminShutdownError)


def processes_mentioning(text: str) -> list[int]:
    """Pids of the processes whose command line or environment contains ``text``."""
    needle = text.encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and any(needle in (proc / name).read_bytes() for name in ("cmdline", "environ")):
                pids.append(int(proc.name))
        except OSError:
            continue  # it ended meanwhile
    return pids


async def fetch_rows(url: str) -> list[tuple[int, str]]:
    conn = await asyncpg.connect(url)
    try:
        return [tuple(row) for row in await conn.fetch("SELECT id, note FROM notes ORDER BY id")]
    finally:
        await conn.close()


async def test_postgres_keeps_data_across_restart_and_crash(private_postgres: PrivatePostgres) -> None:
    url = await private_postgres.create_database("smoke")
    conn = await asyncpg.connect(url)
    await conn.execute("CREATE TABLE notes (id int PRIMARY KEY, note text NOT NULL)")
    await conn.execute("INSERT INTO notes VALUES (1, 'before restart')")
    port = private_postgres.port

    await asyncio.to_thread(private_postgres.restart)

    with pytest.raises(CONNECTION_LOST):
        await conn.fetchval("SELECT 1")
    conn.terminate()
    assert private_postgres.port == port
    assert await fetch_rows(url) == [(1, "before restart")]

    conn = await asyncpg.connect(url)
    await conn.execute("INSERT INTO notes VALUES (2, 'before crash')")
    await asyncio.to_thread(private_postgres.stop, "immediate")
    assert not private_postgres.running
    with pytest.raises(OSError):
        await asyncpg.connect(url)
    await asyncio.to_thread(private_postgres.start)

    with pytest.raises(CONNECTION_LOST):
        await conn.fetchval("SELECT 1")
    conn.terminate()
    assert await fetch_rows(url) == [(1, "before restart"), (2, "before crash")]
    assert "database system was interrupted" in private_postgres.log_tail()


async def test_postgres_destroy_leaves_nothing_behind(private_postgres: PrivatePostgres) -> None:
    folder = str(private_postgres.base_dir)
    assert processes_mentioning(folder)

    private_postgres.destroy()  # the fixture destroys it once more: a no-op

    assert processes_mentioning(folder) == []
    assert not os.path.exists(folder)


QUORUM: dict[str, FieldValue] = {"x-queue-type": "quorum"}


async def publish_persistent(url: str, queue_name: str, body: bytes) -> None:
    """Declare a durable quorum queue and publish ``body`` to it, confirmed by the broker."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(queue_name, durable=True, arguments=QUORUM)
        message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        await channel.default_exchange.publish(message, routing_key=queue.name)
    finally:
        await connection.close()


async def get_one(url: str, queue_name: str) -> bytes:
    """Take one message off the queue (auto-acknowledged); fails when the queue is empty."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(queue_name, durable=True, arguments=QUORUM)
        message = await queue.get(no_ack=True, timeout=5)
        return message.body
    finally:
        await connection.close()


async def test_rabbitmq_quorum_queue_keeps_persistent_messages(private_rabbitmq: PrivateRabbitMQ) -> None:
    url = private_rabbitmq.url
    await publish_persistent(url, "faults-smoke", b"survives a restart")
    await publish_persistent(url, "faults-smoke", b"survives a crash")
    holder = await aio_pika.connect(url)
    queue = await (await holder.channel()).declare_queue("faults-smoke", durable=True, arguments=QUORUM)
    held = await queue.get(timeout=5)  # left unacknowledged
    assert held.body == b"survives a restart"
    await wait_for_queue_counts(private_rabbitmq, "faults-smoke", ready=1, unacked=1)

    await asyncio.to_thread(private_rabbitmq.restart)

    with pytest.raises(RuntimeError, match="closed"):  # aio_pika's word for a connection the broker closed
        await holder.channel()
    assert private_rabbitmq.url == url
    assert await get_one(url, "faults-smoke") == b"survives a restart"  # back in the queue, its holder gone

    await asyncio.to_thread(private_rabbitmq.stop, "kill")
    assert private_rabbitmq.short_name not in epmd_names()
    await asyncio.to_thread(private_rabbitmq.start)
    assert await get_one(url, "faults-smoke") == b"survives a crash"
    await wait_for_queue_counts(private_rabbitmq, "faults-smoke", ready=0, unacked=0)


async def test_rabbitmq_destroy_leaves_nothing_behind(private_rabbitmq: PrivateRabbitMQ) -> None:
    assert private_rabbitmq.short_name in epmd_names()
    folder = str(private_rabbitmq.base_dir)
    assert processes_mentioning(folder)

    private_rabbitmq.destroy()  # the fixture destroys it once more: a no-op

    assert processes_mentioning(folder) == []
    assert private_rabbitmq.short_name not in epmd_names()
    assert not os.path.exists(folder)


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    """A tiny echo server in the test's event loop."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(4096):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


async def roundtrip(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await reader.readexactly(len(payload))
    finally:
        writer.close()


async def test_proxy_blocks_and_unblocks(echo_port: int, tcp_proxy: Callable[[str, int], TcpProxy]) -> None:
    proxy = tcp_proxy("127.0.0.1", echo_port)
    reader, writer = await asyncio.open_connection(*proxy.endpoint)
    writer.write(b"ping")
    assert await reader.readexactly(4) == b"ping"
    assert await roundtrip(proxy.port, b"x" * 300_000) == b"x" * 300_000
    await wait_for(lambda: proxy.open_connections == 1, timeout=5)  # the round trip's link winds down

    proxy.block()

    with pytest.raises(ConnectionResetError):
        await reader.read(1)
    writer.close()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection(*proxy.endpoint)
    assert proxy.open_connections == 0

    proxy.unblock()

    assert await roundtrip(proxy.port, b"pong") == b"pong"


async def test_proxy_cuts_postgres_off(
    private_postgres: PrivatePostgres, tcp_proxy: Callable[[str, int], TcpProxy]
) -> None:
    proxy = tcp_proxy("127.0.0.1", private_postgres.port)
    url = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
    conn = await asyncpg.connect(url)
    assert await conn.fetchval("SELECT 1") == 1

    proxy.block()

    with pytest.raises(CONNECTION_LOST):
        await conn.fetchval("SELECT 1")
    conn.terminate()
    with pytest.raises(OSError):
        await asyncpg.connect(url)

    proxy.unblock()

    conn = await asyncpg.connect(url)
    assert await conn.fetchval("SELECT 2") == 2
    await conn.close()


async def test_proxy_to_a_stopped_server_resets(
    private_postgres: PrivatePostgres, tcp_proxy: Callable[[str, int], TcpProxy]
) -> None:
    proxy = tcp_proxy("127.0.0.1", private_postgres.port)
    private_postgres.stop()

    with pytest.raises(CONNECTION_LOST):
        await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres")


async def test_proxy_throttles_and_lets_go(echo_port: int, tcp_proxy: Callable[[str, int], TcpProxy]) -> None:
    proxy = tcp_proxy("127.0.0.1", echo_port)
    payload = b"y" * 60_000
    loop = asyncio.get_running_loop()

    proxy.throttle(100_000)
    started = loop.time()
    assert await roundtrip(proxy.port, payload) == payload
    # 120 kB through the proxy (there and back) at 100 kB/s; the first 5 kB chunk goes at once.
    assert loop.time() - started >= 1.0

    proxy.throttle(None)
    assert await roundtrip(proxy.port, payload * 50) == payload * 50
    with pytest.raises(ValueError):
        proxy.throttle(0)


async def test_proxy_throttles_each_connection_on_its_own(
    echo_port: int, tcp_proxy: Callable[[str, int], TcpProxy]
) -> None:
    proxy = tcp_proxy("127.0.0.1", echo_port)
    payload = b"y" * 60_000
    loop = asyncio.get_running_loop()
    proxy.throttle(100_000, per_connection=True)
    started = loop.time()
    # Three connections at once, 120 kB each at 100 kB/s each: about 1.2 s together, not the 3.6 s that one
    # shared limit would take.
    results = await asyncio.gather(*(roundtrip(proxy.port, payload) for _ in range(3)))
    assert results == [payload] * 3
    assert 1.0 <= loop.time() - started < 3.0


async def test_proxy_answers_with_an_error_and_forwards_again(
    moto: MotoServer, tcp_proxy: Callable[[str, int], TcpProxy]
) -> None:
    target = urllib.parse.urlsplit(moto.endpoint_url)
    proxy = tcp_proxy(target.hostname or "127.0.0.1", target.port or 80)
    url = f"http://127.0.0.1:{proxy.port}/"
    async with aiohttp.ClientSession() as http:
        proxy.answer_with(500)
        async with http.get(url) as failing:
            assert failing.status == 500
            assert b"<Code>InternalError</Code>" in await failing.read()
        proxy.answer_with(None)
        async with http.get(url) as forwarded:
            assert forwarded.status == 200  # moto's list of buckets
