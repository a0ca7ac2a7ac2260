"""Several broker nodes (docs/deploy.md: Broker clusters): ``CHATEXPORT_AMQP_URL`` names one or more nodes, a
part connects to the first that answers and, when its node goes, moves to the next with its consumers and
publisher confirms; the quorum queues' group size is an argument RabbitMQ's equivalence check holds to; the
worker tells when a queue has fewer members than wanted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import pydantic
import pytest
from pamqp.commands import Basic
from prometheus_client import REGISTRY
from yarl import URL

from devtools.broker import delete_broker_objects
from devtools.servers import HOST, PrivateRabbitMQ, TcpProxy
from services.worker.queue.members import check_queue_members
from shared import broker
from shared.settings import Settings, amqp_node_urls
from tests.support import AMQP_URL, unique, wait_for
from tests.support.reconnects import restoration
from tests.support.sockets import refusing_socket

# -- the setting


@pytest.mark.parametrize(
    ("value", "nodes"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/", ["amqp://guest:guest@127.0.0.1:5672/"]),
        ("amqp://u:p@a:5672/,amqps://u:p@b:5671/v", ["amqp://u:p@a:5672/", "amqps://u:p@b:5671/v"]),
        ("amqp://a/ , amqp://b/,amqp://c/", ["amqp://a/", "amqp://b/", "amqp://c/"]),
    ],
)
def test_the_amqp_url_names_one_node_or_several(value: str, nodes: list[str]) -> None:
    assert amqp_node_urls(Settings(amqp_url=value).amqp_url) == nodes


@pytest.mark.parametrize(
    "value",
    [
        "",
        "amqp://u:secret@a/,",
        "amqp://u:secret@a/,,amqp://b/",
        "http://u:secret@a:5672/",
        "amqp://u:secret@:5672/",
        "amqp://u:secret@a:99999/",
        "u:secret@a:5672",
    ],
)
def test_an_amqp_url_that_is_not_a_list_of_nodes_is_refused_without_its_password(value: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="CHATEXPORT_AMQP_URL") as refused:
        Settings(amqp_url=value)
    # What `chatexport` prints of a refused setting: the messages, not the input.
    assert not any("secret" in error["msg"] for error in refused.value.errors())


@pytest.mark.parametrize("value", ["amqp://guest:guest@h:15672/", "h:15672", "http://:15672/"])
def test_a_management_url_that_is_not_http_is_refused(value: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="CHATEXPORT_AMQP_MANAGEMENT_URL"):
        Settings(amqp_management_url=value)


def test_the_group_size_argument_is_left_out_unless_set() -> None:
    assert broker.quorum_arguments(Settings()) == {"x-queue-type": "quorum"}
    assert broker.quorum_arguments(Settings(amqp_quorum_initial_group_size=3)) == {
        "x-queue-type": "quorum",
        "x-quorum-initial-group-size": 3,
    }


def test_a_node_is_logged_without_its_credentials() -> None:
    (node,) = broker.node_urls(Settings(amqp_url="amqps://user:secret@rabbit-2:5671/prod"))
    assert broker.node_label(node) == "amqps://rabbit-2:5671/prod"


# -- on the real broker


@pytest.fixture
async def settings() -> AsyncIterator[Settings]:
    """Settings with queue and exchange names of this test's own; its broker objects are deleted after."""
    own = Settings(amqp_url=AMQP_URL, amqp_exchange=unique("nodes-x"), amqp_queue=unique("nodes-q"))
    yield own
    await delete_broker_objects(own)


@pytest.mark.integration
async def test_a_connection_skips_a_node_that_does_not_answer(settings: Settings, caplog: Any) -> None:
    with refusing_socket() as silent:
        closed = f"amqp://guest:secret@{HOST}:{silent.getsockname()[1]}/"
        nodes = settings.model_copy(update={"amqp_url": f"{closed},{AMQP_URL}", "amqp_connect_timeout_seconds": 5.0})
        with caplog.at_level(logging.INFO, logger="shared.broker"):
            connection = await asyncio.wait_for(broker.connect(nodes, name="test"), timeout=30)
    try:
        assert connection.connected.is_set()
        assert broker.node_urls(nodes)[1] == node_of(connection)
        skipped, connected = (
            [record for record in caplog.records if record.getMessage() == message]
            for message in ("broker node unavailable; trying the next", "broker connected")
        )
        assert [record.node for record in skipped] == [broker.node_label(broker.node_urls(nodes)[0])]
        assert [record.node for record in connected] == [broker.node_label(broker.node_urls(nodes)[1])]
        assert "secret" not in caplog.text
    finally:
        await connection.close()


@pytest.mark.integration
async def test_a_connection_whose_node_goes_moves_on_with_its_consumer_and_confirms(settings: Settings) -> None:
    """The first node is a proxy to the broker, the second the broker itself: cutting the proxy off loses the
    first node, as a dead node would, and the queues live on where the connection moves to.
    """
    host, port = URL(AMQP_URL).host, URL(AMQP_URL).port
    assert host is not None and port is not None
    with TcpProxy(host, port) as proxy:
        proxied = f"amqp://guest:guest@{HOST}:{proxy.port}/"
        nodes = settings.model_copy(update={"amqp_url": f"{proxied},{AMQP_URL}"})
        session = await asyncio.wait_for(broker.open_session(nodes, name="test", on_return_raises=True), 30)
        try:
            received: asyncio.Queue[bytes] = asyncio.Queue()

            async def consume(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                await received.put(message.body)
                await message.ack()

            await session.queue.consume(consume)
            assert node_of(session.connection).port == proxy.port
            restored = restoration(session.connection)
            proxy.block()
            await asyncio.wait_for(restored.wait(), timeout=30)
            assert node_of(session.connection).port == port
            confirm = await publish(session, b"after the move")
            assert isinstance(confirm, Basic.Ack)
            assert await asyncio.wait_for(received.get(), timeout=20) == b"after the move"
        finally:
            await session.connection.close()


def node_of(connection: aio_pika.abc.AbstractRobustConnection) -> URL:
    """The URL of the node ``connection`` is on (or tries next)."""
    assert isinstance(connection, broker.NodeRotatingConnection)
    return connection.url


async def publish(session: broker.BrokerSession, body: bytes) -> object:
    """Publish a wake-up as the relay does (mandatory, with a timeout); the broker's confirm."""
    return await session.exchange.publish(
        aio_pika.Message(body), routing_key=broker.EXPORT_ROUTING_KEY, mandatory=True, timeout=20
    )


@pytest.mark.integration
@pytest.mark.parametrize(("first", "then"), [(None, 3), (3, None), (3, 5)])
async def test_redeclaring_a_queue_with_another_group_size_is_refused(
    settings: Settings, first: int | None, then: int | None
) -> None:
    """What the migration in docs/deploy.md (Broker clusters) rests on: RabbitMQ 3.10 holds an existing
    queue's ``x-quorum-initial-group-size`` (present or absent) to its equivalence check.
    """
    connection = await aio_pika.connect(AMQP_URL)
    try:
        channel = await connection.channel()
        await broker.declare_topology(channel, settings.model_copy(update={"amqp_quorum_initial_group_size": first}))
        changed = settings.model_copy(update={"amqp_quorum_initial_group_size": then})
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed, match="x-quorum-initial-group-size"):
            await broker.declare_topology(await connection.channel(), changed)
        await broker.declare_topology(
            await connection.channel(), settings.model_copy(update={"amqp_quorum_initial_group_size": first})
        )
    finally:
        await connection.close()


# -- the member check


@pytest.fixture(scope="module")
def managed_rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRabbitMQ]:
    """A single RabbitMQ node of this module's own, with the management plugin."""
    server = PrivateRabbitMQ(management=True)
    try:
        server.start()
        yield server
    finally:
        server.destroy(keep_log_as=tmp_path_factory.mktemp("rabbitmq") / "managed-rabbitmq.log")


def management_url(server: PrivateRabbitMQ) -> str:
    return f"http://guest:guest@{HOST}:{server.management_port}/"


async def management_answers(url: str) -> bool:
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{url}api/overview", timeout=aiohttp.ClientTimeout(total=2)) as response,
        ):
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def declared_on(rabbitmq: PrivateRabbitMQ, *, wanted: int) -> Settings:
    """Settings naming ``rabbitmq``, its management API and ``wanted`` members, whose queues are declared."""
    url = management_url(rabbitmq)
    await wait_for(lambda: management_answers(url), timeout=60)
    settings = Settings(
        amqp_url=rabbitmq.url,
        amqp_exchange=unique("members-x"),
        amqp_queue=unique("members-q"),
        amqp_management_url=url,
        amqp_quorum_initial_group_size=wanted,
    )
    session = await broker.open_session(settings, name="test")
    await session.connection.close()
    return settings


@pytest.mark.integration
async def test_a_queue_with_fewer_members_than_wanted_is_told_and_counted(
    managed_rabbitmq: PrivateRabbitMQ, caplog: Any, tmp_path: Path
) -> None:
    """On one node every queue has one member: with three wanted, the check warns for each and counts 1."""
    settings = await declared_on(managed_rabbitmq, wanted=3)
    counts: dict[str, int] = {}
    with caplog.at_level(logging.WARNING, logger="services.worker.queue.members"):
        await check_queue_members(settings, counts)
        await check_queue_members(settings, counts)  # unchanged: not told again
    warned = [record for record in caplog.records if record.getMessage().startswith("quorum queue has fewer members")]
    assert sorted(record.queue for record in warned) == sorted(broker.queue_names(settings))
    assert all(record.wanted == 3 and record.members == [managed_rabbitmq.node_name] for record in warned)
    assert "guest:guest" not in caplog.text
    for queue in broker.queue_names(settings):
        assert REGISTRY.get_sample_value("chatexport_broker_queue_members", {"queue": queue}) == 1


@pytest.mark.integration
async def test_a_queue_with_the_members_wanted_is_not_told(managed_rabbitmq: PrivateRabbitMQ, caplog: Any) -> None:
    settings = await declared_on(managed_rabbitmq, wanted=1)
    with caplog.at_level(logging.WARNING, logger="services.worker.queue.members"):
        await check_queue_members(settings, {})
    assert not [record for record in caplog.records if record.name == "services.worker.queue.members"]
    assert REGISTRY.get_sample_value("chatexport_broker_queue_members", {"queue": settings.amqp_queue}) == 1
