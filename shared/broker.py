"""RabbitMQ topology and connections (docs/architecture.md: How it works).

A message is only a wake-up: ``{"operation_id": ...}`` on a durable quorum queue with a dead-letter
exchange. Postgres decides what happens; a lost or duplicated message may delay work but never changes an
outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue, AbstractRobustConnection

from shared.lifecycle import keep_trying
from shared.settings import Settings

EXPORT_ROUTING_KEY = "export.run"
# A chunk's wake-up, ``{"operation_id": ..., "chunk": n}``, on a queue of its own (docs/chunks.md: Chunked
# exports): a worker of an earlier release, which reads only ``operation_id``, never consumes it, and a small
# export never waits behind queued chunks.
CHUNK_ROUTING_KEY = "export.chunk"
# What connecting to an unreachable or overloaded broker raises.
CONNECT_ERRORS: tuple[type[BaseException], ...] = (aio_pika.exceptions.AMQPConnectionError, OSError, TimeoutError)
# What the first steps on a new connection raise when the broker goes away under them: aiormq reports a
# channel asked of a connection closed meanwhile as RuntimeError ("<Connection ...> closed").
START_ERRORS: tuple[type[BaseException], ...] = (
    *CONNECT_ERRORS,
    aio_pika.exceptions.ConnectionClosed,
    aio_pika.exceptions.ChannelInvalidStateError,
    RuntimeError,
)


def dead_letter_exchange_name(settings: Settings) -> str:
    """The dead-letter exchange of the work queue: ``<exchange>.dlx``."""
    return f"{settings.amqp_exchange}.dlx"


def chunk_queue_name(settings: Settings) -> str:
    """The chunk queue: ``<queue>.chunks``."""
    return f"{settings.amqp_queue}.chunks"


async def connect(settings: Settings, *, name: str) -> AbstractRobustConnection:
    """Open a robust connection named ``name`` (shown in the broker's management UI).

    Heartbeats every ``amqp_heartbeat_seconds``: a broker that stops answering without closing the
    connection is noticed after two or three of them (readiness turns 503, and the connection reconnects),
    rather than after RabbitMQ's default of a minute each.

    Raises ``aio_pika.exceptions.AMQPConnectionError`` or ``OSError`` when the broker is unreachable.
    """
    return await aio_pika.connect_robust(
        settings.amqp_url,
        client_properties={"connection_name": name},
        timeout=settings.amqp_connect_timeout_seconds,
        heartbeat=settings.amqp_heartbeat_seconds,
    )


@dataclass(frozen=True)
class BrokerSession:
    """A part's broker resources: its robust ``connection``, and the work ``exchange``, ``queue`` and
    ``chunk_queue`` declared through the one channel it opened on it (the channel lives as long as they do).
    """

    connection: AbstractRobustConnection
    exchange: AbstractExchange
    queue: AbstractQueue
    chunk_queue: AbstractQueue


async def open_session(
    settings: Settings, *, name: str, prefetch_count: int | None = None, on_return_raises: bool = False
) -> BrokerSession:
    """``connect``, open a channel with publisher confirms (``on_return_raises``: an unroutable publish
    raises; ``prefetch_count``: at most that many unacknowledged deliveries) and ``declare_topology``. The
    connection is closed again when a later step fails, with ``START_ERRORS`` when the broker went away.
    """
    connection = await connect(settings, name=name)
    try:
        channel = await connection.channel(on_return_raises=on_return_raises)
        if prefetch_count is not None:
            await channel.set_qos(prefetch_count=prefetch_count)
        exchange, queue, chunk_queue = await declare_topology(channel, settings)
    except BaseException:
        with contextlib.suppress(Exception):
            await connection.close()
        raise
    return BrokerSession(connection, exchange, queue, chunk_queue)


async def open_session_when_ready(
    settings: Settings,
    *,
    name: str,
    stop: asyncio.Event,
    prefetch_count: int | None = None,
    on_return_raises: bool = False,
) -> BrokerSession:
    """``open_session``, retried with backoff until every step of it succeeds: a broker that goes away between
    the connection and the topology is waited for like one that was not up yet. Raises ``Stopped`` on
    ``stop``.
    """
    return await keep_trying(
        lambda: open_session(settings, name=name, prefetch_count=prefetch_count, on_return_raises=on_return_raises),
        what="broker",
        errors=START_ERRORS,
        stop=stop,
    )


async def declare_topology(
    channel: AbstractChannel, settings: Settings
) -> tuple[AbstractExchange, AbstractQueue, AbstractQueue]:
    """Declare the work exchange, the quorum work and chunk queues and their dead-letter queue; return
    (exchange, work queue, chunk queue).

    Idempotent: every part may call it on start-up. Over ``amqp_delivery_limit`` redeliveries a message is
    dead-lettered rather than dropped (a quorum queue drops what it cannot dead-letter).
    """
    dlx_name = dead_letter_exchange_name(settings)
    dlx = await channel.declare_exchange(dlx_name, aio_pika.ExchangeType.FANOUT, durable=True)
    dead = await channel.declare_queue(
        f"{settings.amqp_queue}.dead", durable=True, arguments={"x-queue-type": "quorum"}
    )
    await dead.bind(dlx)
    exchange = await channel.declare_exchange(settings.amqp_exchange, aio_pika.ExchangeType.DIRECT, durable=True)
    arguments: dict[str, Any] = {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": dlx_name,
        "x-delivery-limit": settings.amqp_delivery_limit,
    }
    queue = await channel.declare_queue(settings.amqp_queue, durable=True, arguments=arguments)
    await queue.bind(exchange, routing_key=EXPORT_ROUTING_KEY)
    chunks = await channel.declare_queue(chunk_queue_name(settings), durable=True, arguments=arguments)
    await chunks.bind(exchange, routing_key=CHUNK_ROUTING_KEY)
    return exchange, queue, chunks
