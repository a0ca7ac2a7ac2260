"""Broker housekeeping for tests and benchmarks, which share one RabbitMQ: remove the queues and exchanges
that one set of settings declared (a test's, or a ``LocalSystem``'s once it has stopped).
"""

from __future__ import annotations

from shared.broker import connect, queue_names
from shared.settings import Settings


async def delete_broker_objects(settings: Settings) -> None:
    """Delete the work, chunk and dead-letter queues and exchanges named by ``settings``, so the shared broker does
    not fill up.
    """
    connection = await connect(settings, name="cleanup")
    try:
        channel = await connection.channel()
        for queue in queue_names(settings):
            await channel.queue_delete(queue)
        for exchange in (settings.amqp_exchange, f"{settings.amqp_exchange}.dlx"):
            await channel.exchange_delete(exchange)
    finally:
        await connection.close()
