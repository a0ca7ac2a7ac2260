"""A part's broker start-up is one step retried as a whole (docs/states.md: States and failure model): a broker that
goes away between the connection and the topology (a restart at that moment) is waited for like one that was not
up yet, instead of ending the part.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aio_pika
import pytest

from devtools.broker import delete_broker_objects
from shared import broker
from shared.settings import Settings
from tests.support import AMQP_URL, unique

pytestmark = pytest.mark.integration  # the real RabbitMQ, reached without a fixture


async def test_a_connection_lost_before_its_channel_is_opened_again(monkeypatch: Any, caplog: Any) -> None:
    settings = Settings(amqp_url=AMQP_URL, amqp_exchange=unique("session-x"), amqp_queue=unique("session-q"))
    real_connect = broker.connect
    connections: list[aio_pika.abc.AbstractRobustConnection] = []

    async def lost_at_first(settings: Settings, *, name: str) -> aio_pika.abc.AbstractRobustConnection:
        connection = await real_connect(settings, name=name)
        connections.append(connection)
        if len(connections) == 1:
            await connection.close()  # as a broker killed right after the handshake leaves it
        return connection

    monkeypatch.setattr(broker, "connect", lost_at_first)
    stop = asyncio.Event()
    try:
        with caplog.at_level(logging.WARNING, logger="shared.lifecycle"):
            session = await asyncio.wait_for(
                broker.open_session_when_ready(settings, name="test", stop=stop, prefetch_count=2), timeout=30
            )
        try:
            assert len(connections) == 2
            assert session.connection is connections[1]
            assert session.queue.name == settings.amqp_queue
            assert any(record.getMessage() == "broker unavailable; retrying" for record in caplog.records)
        finally:
            await session.connection.close()
    finally:
        await delete_broker_objects(settings)


async def test_a_topology_that_contradicts_the_broker_s_still_ends_the_start(monkeypatch: Any) -> None:
    settings = Settings(amqp_url=AMQP_URL, amqp_exchange=unique("session-x"), amqp_queue=unique("session-q"))
    connection = await aio_pika.connect(AMQP_URL)
    try:
        channel = await connection.channel()
        await channel.declare_queue(settings.amqp_queue, durable=False)  # a classic queue of the same name
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
            await asyncio.wait_for(broker.open_session_when_ready(settings, name="test", stop=asyncio.Event()), 30)
    finally:
        await connection.close()
        await delete_broker_objects(settings)
