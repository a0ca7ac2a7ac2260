"""The relay's entry point: builds its resources, publishes until SIGTERM, then closes them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from services.relay.relay import Relay
from services.relay.webhooks import WebhookSender
from shared import broker, tracing
from shared.lifecycle import run_until_signalled, started
from shared.logs import configure_logging
from shared.monitoring import Monitor, broker_check, serving_with_database
from shared.settings import RelayPartSettings

log = logging.getLogger(__name__)


async def serve(settings: RelayPartSettings, *, stop: asyncio.Event) -> None:
    """Relay outbox rows and send completion callbacks until ``stop`` is set. A batch in flight completes
    before the relay exits.

    Waits for the database and the broker if they are not reachable yet.
    """
    monitor = Monitor("relay", needs=("database", "broker"))
    async with contextlib.AsyncExitStack() as resources:
        pool = await resources.enter_async_context(serving_with_database(monitor, settings, stop=stop))
        session = await broker.open_session_when_ready(
            settings, name=f"relay {os.getpid()}", stop=stop, on_return_raises=True
        )
        resources.push_async_callback(session.connection.close)
        # Ready once it can publish: the exchange it publishes to exists.
        monitor.checks["broker"] = broker_check(session.connection)
        log.info("relay started", extra={"exchange": settings.amqp_exchange})
        # Completion callbacks are what the outbox holds too: the relay sends both (docs/architecture.md: How it works).
        webhooks = await resources.enter_async_context(WebhookSender(pool=pool, settings=settings))
        started()
        async with asyncio.TaskGroup() as group:
            relay = Relay(pool=pool, channel=session.channel, exchange=session.exchange, settings=settings)
            group.create_task(relay.run(stop=stop))
            group.create_task(webhooks.run(stop=stop))


def main(settings: RelayPartSettings) -> None:
    """Run the relay until SIGINT or SIGTERM."""
    configure_logging(settings, service="relay")
    with tracing.traced("relay"):
        asyncio.run(run_until_signalled(serve, settings))
