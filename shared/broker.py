"""RabbitMQ topology and connections (README: How it works).

A message is only a wake-up: ``{"operation_id": ...}`` on a durable quorum queue with a dead-letter
exchange. Postgres decides what happens; a lost or duplicated message may delay work but never changes an
outcome.
"""

from __future__ import annotations

import asyncio

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue, AbstractRobustConnection

from shared.lifecycle import keep_trying
from shared.settings import Settings

EXPORT_ROUTING_KEY = "export.run"
# What connecting to an unreachable or overloaded broker raises.
CONNECT_ERRORS: tuple[type[BaseException], ...] = (aio_pika.exceptions.AMQPConnectionError, OSError, TimeoutError)


def dead_letter_exchange_name(settings: Settings) -> str:
    """The dead-letter exchange of the work queue: ``<exchange>.dlx``."""
    return f"{settings.amqp_exchange}.dlx"


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


async def connect_when_ready(settings: Settings, *, name: str, stop: asyncio.Event) -> AbstractRobustConnection:
    """``connect``, retried with backoff while the broker is unreachable; raises ``Stopped`` on ``stop``."""
    return await keep_trying(lambda: connect(settings, name=name), what="broker", errors=CONNECT_ERRORS, stop=stop)


async def declare_topology(channel: AbstractChannel, settings: Settings) -> tuple[AbstractExchange, AbstractQueue]:
    """Declare the work exchange, the quorum work queue and its dead-letter queue; return (exchange, queue).

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
    queue = await channel.declare_queue(
        settings.amqp_queue,
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": dlx_name,
            "x-delivery-limit": settings.amqp_delivery_limit,
        },
    )
    await queue.bind(exchange, routing_key=EXPORT_ROUTING_KEY)
    return exchange, queue
