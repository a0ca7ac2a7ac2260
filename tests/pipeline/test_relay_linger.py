"""Rows announced while the relay was busy are claimed ``CHATEXPORT_RELAY_LINGER_SECONDS`` after that batch
began, a row announced to an idle relay at once, and a stop ends the wait (docs/architecture.md: The outbox).
The relay runs against the real Postgres and RabbitMQ.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest

from services.relay.relay import Batch, Relay
from shared import broker
from shared.repository import outbox
from shared.settings import Settings
from tests.support import wait_for

# Far longer than any wait of these tests: a linger that applied where it should not would show.
LONG_LINGER_SECONDS = 600.0
# How long a relay that did not linger is given to claim a row it was told of; it takes milliseconds.
OBSERVED_SECONDS = 1.0


class AnnouncedWhileBusy(Relay):
    """A relay under load: while its first batch with rows runs, one more row is enqueued (a submit's), and the
    batch ends only once the relay has heard of it.
    """

    def __init__(self, *, pool: asyncpg.Pool, **kwargs: Any) -> None:
        super().__init__(pool=pool, **kwargs)
        self.pool = pool
        self.claims = 0
        self.wake: asyncio.Event | None = None

    async def _ensure_listener(self, listener: asyncpg.Connection | None, wake: asyncio.Event) -> Any:
        self.wake = wake
        return await super()._ensure_listener(listener, wake)

    async def publish_due(self) -> Batch:
        batch = await super().publish_due()
        if batch.handled:
            self.claims += 1
        if batch.handled and self.claims == 1:
            async with self.pool.acquire() as conn:
                await outbox.enqueue_run(conn, operation_id="op_announced")
            wake = self.wake
            assert wake is not None
            await wait_for(wake.is_set)
        return batch


async def published(pool: asyncpg.Pool, operation_id: str) -> bool:
    at = await pool.fetchval("SELECT published_at FROM outbox WHERE operation_id = $1", operation_id)
    return at is not None


@asynccontextmanager
async def running(
    settings: Settings, pool: asyncpg.Pool, linger: float, make: Callable[..., Relay] = Relay
) -> AsyncIterator[tuple[Relay, asyncio.Event, asyncio.Task[None]]]:
    """A relay of ``make`` with ``relay_linger_seconds`` at ``linger``, running until the block ends."""
    lingering = settings.model_copy(update={"relay_linger_seconds": linger})
    stop = asyncio.Event()
    session = await broker.open_session_when_ready(lingering, name="relay under test", stop=stop, on_return_raises=True)
    try:
        relay = make(pool=pool, channel=session.channel, exchange=session.exchange, settings=lingering)
        task = asyncio.create_task(relay.run(stop=stop))
        try:
            yield relay, stop, task
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
    finally:
        await session.connection.close()


async def test_rows_announced_to_an_idle_relay_go_out_at_once_whatever_the_linger(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with running(settings, pool, LONG_LINGER_SECONDS):
        for operation_id in ("op_1", "op_2"):
            async with pool.acquire() as conn:
                await outbox.enqueue_run(conn, operation_id=operation_id)
            await wait_for(functools.partial(published, pool, operation_id), timeout=30)


async def test_a_row_announced_during_a_batch_waits_for_the_linger_then_goes_out(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    linger = 4 * OBSERVED_SECONDS
    async with running(settings, pool, linger, AnnouncedWhileBusy) as (relay, _, _):
        async with pool.acquire() as conn:
            await outbox.enqueue_run(conn, operation_id="op_first")
        await wait_for(lambda: published(pool, "op_first"), timeout=30)
        with pytest.raises(AssertionError, match="not met"):
            await wait_for(lambda: published(pool, "op_announced"), timeout=OBSERVED_SECONDS)
        await wait_for(lambda: published(pool, "op_announced"), timeout=30)
        assert isinstance(relay, AnnouncedWhileBusy) and relay.claims == 2


async def test_a_stop_ends_the_linger(settings: Settings, pool: asyncpg.Pool) -> None:
    async with running(settings, pool, LONG_LINGER_SECONDS, AnnouncedWhileBusy) as (relay, stop, task):
        async with pool.acquire() as conn:
            await outbox.enqueue_run(conn, operation_id="op_first")
        await wait_for(lambda: published(pool, "op_first"), timeout=30)
        stop.set()
        await asyncio.wait_for(task, 10)
        assert not await published(pool, "op_announced")
        assert isinstance(relay, AnnouncedWhileBusy) and relay.claims == 1
