"""Waiting for a robust broker connection to come back after its node went."""

from __future__ import annotations

import asyncio

from aio_pika.abc import AbstractRobustConnection


def restoration(connection: AbstractRobustConnection) -> asyncio.Event:
    """An event set once ``connection`` has reconnected and restored its channels, queues and consumers (its
    ``connected`` event is set before they are, so a publish right after it may still meet a closed channel).
    """
    restored = asyncio.Event()

    def on_reconnect(*_: object) -> None:
        restored.set()

    connection.reconnect_callbacks.add(on_reconnect)
    return restored
