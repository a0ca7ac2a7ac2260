"""The worker's consumer stops taking wake-ups while long work holds every slot, and keeps taking them while work
keeps ending (docs/architecture.md: Leases and fencing), on the real RabbitMQ: a queue's consumer count says
whether it consumes. The deliveries are stand-ins that ack at once and then hold their slot until released.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue
from prometheus_client import REGISTRY

from services.worker.queue.consumer import Consumer
from tests.support import AMQP_URL, unique, wait_for

pytestmark = pytest.mark.integration  # the real RabbitMQ, reached without a fixture

WORK = "export"


class HeldDeliveries:
    """Acks each delivery, then holds its slot until ``release`` is set; ``handled`` counts them."""

    what = WORK

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.handled = 0

    def decode(self, body: bytes) -> str | None:
        return body.decode()

    async def handle(self, message: AbstractIncomingMessage, key: str) -> None:
        await message.ack()
        self.handled += 1
        await self.release.wait()


def pauses() -> float:
    return REGISTRY.get_sample_value("chatexport_worker_consumer_pauses_total", {"work": WORK}) or 0.0


@pytest.fixture
async def queue() -> AsyncIterator[tuple[aio_pika.abc.AbstractChannel, AbstractQueue]]:
    """A queue of its own on a channel whose prefetch is 1, as a worker of one slot sets it."""
    connection = await aio_pika.connect(AMQP_URL)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1)
        # Not auto-delete: the broker would delete it at the consumer's cancel.
        declared = await channel.declare_queue(unique("flow-q"))
        try:
            yield channel, declared
        finally:
            await declared.delete(if_unused=False, if_empty=False)
    finally:
        await connection.close()


async def publish(channel: aio_pika.abc.AbstractChannel, queue: AbstractQueue, *bodies: str) -> None:
    for body in bodies:
        await channel.default_exchange.publish(aio_pika.Message(body.encode()), routing_key=queue.name)


async def counts(channel: aio_pika.abc.AbstractChannel, queue: AbstractQueue) -> tuple[int, int]:
    """(ready messages, consumers) of ``queue`` as the broker counts them."""
    declared = await channel.declare_queue(queue.name, passive=True)
    result = declared.declaration_result
    assert result.message_count is not None and result.consumer_count is not None
    return result.message_count, result.consumer_count


async def wait_for_counts(channel: aio_pika.abc.AbstractChannel, queue: AbstractQueue, wanted: tuple[int, int]) -> None:
    async def reached() -> bool:
        return await counts(channel, queue) == wanted

    await wait_for(reached, timeout=10)


async def test_a_consumer_whose_slots_stay_busy_stops_taking_wake_ups_until_one_frees(
    queue: tuple[aio_pika.abc.AbstractChannel, AbstractQueue],
) -> None:
    channel, declared = queue
    deliveries = HeldDeliveries()
    consumer = Consumer(queue=declared, deliveries=deliveries, concurrency=1, pause_after_seconds=0.05)
    before = pauses()
    consumer.start()
    try:
        await wait_for_counts(channel, declared, (0, 1))
        await publish(channel, declared, "first")
        await wait_for(lambda: deliveries.handled == 1, timeout=10)
        await wait_for_counts(channel, declared, (0, 0))
        assert pauses() == before + 1
        # Published while the one slot is held: it stays in the queue, for a worker with a free slot.
        await publish(channel, declared, "second")
        await wait_for_counts(channel, declared, (1, 0))
        assert deliveries.handled == 1

        deliveries.release.set()
        await wait_for(lambda: deliveries.handled == 2, timeout=10)
    finally:
        deliveries.release.set()
        await consumer.stop()


async def test_a_consumer_keeps_taking_wake_ups_while_its_work_keeps_ending(
    queue: tuple[aio_pika.abc.AbstractChannel, AbstractQueue],
) -> None:
    channel, declared = queue
    deliveries = HeldDeliveries()
    deliveries.release.set()  # every delivery's work ends at once
    # A grace far beyond what one delivery takes on a loaded machine: only a consumer that pauses the moment its
    # slot fills, as it did, is cancelled here.
    consumer = Consumer(queue=declared, deliveries=deliveries, concurrency=1, pause_after_seconds=30.0)
    before = pauses()
    consumer.start()
    try:
        await publish(channel, declared, *(f"backlog-{number}" for number in range(20)))
        await wait_for(lambda: deliveries.handled == 20, timeout=30)
        assert pauses() == before
        assert await counts(channel, declared) == (0, 1)
    finally:
        await consumer.stop()
