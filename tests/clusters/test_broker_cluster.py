"""A part's broker connection on a three-node RabbitMQ cluster (docs/deploy.md: Broker clusters): when the node
it is on is killed, it moves to another node, where its consumer of the quorum work queue receives what is
published after the kill and its publishes are confirmed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aio_pika
import pytest
from pamqp.commands import Basic

from devtools.broker import delete_broker_objects
from devtools.clusters import RabbitCluster
from devtools.servers import PrivateRabbitMQ
from shared import broker
from shared.settings import Settings
from tests.support import unique
from tests.support.reconnects import restoration

MOVE_TIMEOUT_SECONDS = 60.0


@pytest.fixture
async def settings(rabbit_cluster: RabbitCluster) -> AsyncIterator[Settings]:
    """Settings naming every node of the cluster, with queue names of this test's own (deleted after)."""
    own = Settings(
        amqp_url=rabbit_cluster.amqp_url,
        amqp_exchange=unique("cluster-x"),
        amqp_queue=unique("cluster-q"),
        amqp_quorum_initial_group_size=3,
    )
    yield own
    await asyncio.to_thread(rabbit_cluster.start)  # the killed node back, so that every queue can be deleted
    await delete_broker_objects(own)


def node_of(cluster: RabbitCluster, connection: aio_pika.abc.AbstractRobustConnection) -> PrivateRabbitMQ:
    """The node of ``cluster`` whose port ``connection`` is connected (or connecting) to."""
    assert isinstance(connection, broker.NodeRotatingConnection)
    (node,) = [node for node in cluster.nodes if node.port == connection.url.port]
    return node


async def test_a_session_whose_node_is_killed_consumes_and_publishes_on_another(
    rabbit_cluster: RabbitCluster, settings: Settings
) -> None:
    session = await asyncio.wait_for(broker.open_session(settings, name="test", on_return_raises=True), 60)
    try:
        assert rabbit_cluster.members_of(settings.amqp_queue) == sorted(node.node_name for node in rabbit_cluster.nodes)
        received: asyncio.Queue[bytes] = asyncio.Queue()

        async def consume(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await received.put(message.body)
            await message.ack()

        await session.queue.consume(consume)
        first = node_of(rabbit_cluster, session.connection)
        restored = restoration(session.connection)
        await asyncio.to_thread(first.stop, "kill")
        await asyncio.wait_for(restored.wait(), timeout=MOVE_TIMEOUT_SECONDS)
        assert node_of(rabbit_cluster, session.connection) is not first
        confirm = await session.exchange.publish(
            aio_pika.Message(b"after the kill"),
            routing_key=broker.EXPORT_ROUTING_KEY,
            mandatory=True,
            timeout=MOVE_TIMEOUT_SECONDS,
        )
        assert isinstance(confirm, Basic.Ack)
        assert await asyncio.wait_for(received.get(), timeout=MOVE_TIMEOUT_SECONDS) == b"after the kill"
    finally:
        await session.connection.close()
