"""The local RabbitMQ cluster (devtools/clusters.py): it forms before any queue is declared, a killed node
comes back into it, and the whole cluster stopped and started together comes back with its messages.
"""

from __future__ import annotations

import asyncio
import os
import signal

import aio_pika

from devtools.clusters import RabbitCluster
from devtools.servers import NET_TICKTIME_SECONDS, PARTITION_HANDLING, PrivateRabbitMQ, ServerError
from tests.support import unique, wait_for

CLUSTER_TIMEOUT_SECONDS = 120.0


async def declare_quorum_queue(url: str, name: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})


async def publish(url: str, queue: str, body: bytes) -> None:
    """Publish ``body`` persistently to ``queue`` and wait for the broker's confirm."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        await channel.default_exchange.publish(message, routing_key=queue, timeout=CLUSTER_TIMEOUT_SECONDS)


async def take(url: str, queue: str) -> bytes | None:
    """Get and ack one message of ``queue`` through the node at ``url``; None when it is empty."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        message = await (await channel.get_queue(queue, ensure=False)).get(fail=False)
        if message is None:
            return None
        await message.ack()
        return message.body


def node_names(cluster: RabbitCluster) -> set[str]:
    return {node.node_name for node in cluster.nodes}


async def running_nodes_are(cluster: RabbitCluster, names: set[str]) -> bool:
    return await asyncio.to_thread(cluster.running_nodes) == names


async def test_a_quorum_queue_declared_after_start_has_a_member_on_every_node(rabbit_cluster: RabbitCluster) -> None:
    queue = unique("cluster-formed")
    await declare_quorum_queue(rabbit_cluster.urls[1], queue)

    assert set(await asyncio.to_thread(rabbit_cluster.members_of, queue)) == node_names(rabbit_cluster)
    assert await asyncio.to_thread(rabbit_cluster.leader_of, queue) in rabbit_cluster.nodes
    assert rabbit_cluster.amqp_url.split(",") == rabbit_cluster.urls


async def led_by_another(cluster: RabbitCluster, queue: str, former: PrivateRabbitMQ) -> bool:
    """True once a node other than ``former`` leads ``queue`` (False while no node answers for one)."""
    try:
        return await asyncio.to_thread(cluster.leader_of, queue) is not former
    except ServerError:
        return False


async def test_a_killed_node_restarts_and_rejoins(rabbit_cluster: RabbitCluster) -> None:
    queue = unique("cluster-rejoin")
    await declare_quorum_queue(rabbit_cluster.urls[0], queue)
    leader = await asyncio.to_thread(rabbit_cluster.leader_of, queue)
    others = [node for node in rabbit_cluster.nodes if node is not leader]

    await asyncio.to_thread(leader.stop, mode="kill")
    await wait_for(lambda: running_nodes_are(rabbit_cluster, node_names(rabbit_cluster) - {leader.node_name}))
    # The two left are a majority; until they have elected a leader, RabbitMQ nacks a publish to the queue.
    await wait_for(lambda: led_by_another(rabbit_cluster, queue, leader), timeout=CLUSTER_TIMEOUT_SECONDS)
    await publish(others[0].url, queue, b"while the leader was down")
    await asyncio.to_thread(leader.start)
    await wait_for(
        lambda: running_nodes_are(rabbit_cluster, node_names(rabbit_cluster)), timeout=CLUSTER_TIMEOUT_SECONDS
    )

    assert await take(leader.url, queue) == b"while the leader was down"
    assert set(await asyncio.to_thread(rabbit_cluster.members_of, queue)) == node_names(rabbit_cluster)


async def test_all_nodes_stopped_then_started_together_come_back(rabbit_cluster: RabbitCluster) -> None:
    queue = unique("cluster-restart")
    await declare_quorum_queue(rabbit_cluster.urls[2], queue)
    await publish(rabbit_cluster.urls[0], queue, b"kept")

    await asyncio.to_thread(rabbit_cluster.stop)
    assert not any(node.running for node in rabbit_cluster.nodes)
    await asyncio.to_thread(rabbit_cluster.start)

    assert await running_nodes_are(rabbit_cluster, node_names(rabbit_cluster))
    assert await take(rabbit_cluster.urls[2], queue) == b"kept"
    assert set(await asyncio.to_thread(rabbit_cluster.members_of, queue)) == node_names(rabbit_cluster)


async def test_every_node_runs_with_the_partition_handling_and_tick_time_the_docs_recommend(
    rabbit_cluster: RabbitCluster,
) -> None:
    for node in rabbit_cluster.nodes:
        handling = await asyncio.to_thread(node.ctl, "eval", "application:get_env(rabbit, cluster_partition_handling).")
        assert handling.strip() == f"{{ok,{PARTITION_HANDLING}}}"
        ticktime = await asyncio.to_thread(node.ctl, "eval", "net_kernel:get_net_ticktime().")
        assert ticktime.strip() == str(NET_TICKTIME_SECONDS)


async def publish_through(url: str, queue: str, *, attempt_seconds: float) -> float:
    """Publish to ``queue`` through the node at ``url`` until the broker confirms, each attempt on a new channel
    and bounded by ``attempt_seconds`` (as the relay does); the seconds it took.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    connection = await aio_pika.connect(url)
    closing: list[asyncio.Future[None]] = []  # the given-up channels' closes, not waited on while trying
    async with connection:
        while True:
            channel = await connection.channel(publisher_confirms=True)
            message = aio_pika.Message(b"wake-up", delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            try:
                await channel.default_exchange.publish(message, routing_key=queue, timeout=attempt_seconds)
                held = loop.time() - started
                await asyncio.gather(*closing, return_exceptions=True)
                return held
            except (TimeoutError, aio_pika.exceptions.DeliveryError):
                closing.append(asyncio.ensure_future(channel.close()))
            if loop.time() - started > CLUSTER_TIMEOUT_SECONDS:
                raise AssertionError(f"no publish confirmed within {CLUSTER_TIMEOUT_SECONDS} s")


async def test_a_frozen_leader_holds_publishes_about_a_tick_time_and_the_cluster_heals_after(
    rabbit_cluster: RabbitCluster,
) -> None:
    """docs/deploy.md: A frozen node. The queue's leader is stopped (SIGSTOP) as a frozen VM or host would be:
    publishes through another node are confirmed once the others declare it down and elect a new leader,
    within the tick time and a little; thawed, the node finds the others have declared it down, and autoheal
    restarts it into the cluster.
    """
    queue = unique("frozen")
    await declare_quorum_queue(rabbit_cluster.urls[0], queue)
    leader = await asyncio.to_thread(rabbit_cluster.leader_of, queue)
    survivor = next(node for node in rabbit_cluster.nodes if node is not leader)
    assert leader.pid is not None
    os.kill(leader.pid, signal.SIGSTOP)
    try:
        held = await publish_through(survivor.url, queue, attempt_seconds=1.0)
    finally:
        os.kill(leader.pid, signal.SIGCONT)
    print(f"\na publish through a live node was held {held:.1f} s by the frozen leader")
    assert held < NET_TICKTIME_SECONDS * 1.25 + 10  # declared down, then a leader elected among the others
    await wait_for(
        lambda: running_nodes_are(rabbit_cluster, node_names(rabbit_cluster)), timeout=CLUSTER_TIMEOUT_SECONDS
    )
