"""Rows announced while the relay was busy are claimed ``CHATEXPORT_RELAY_LINGER_SECONDS`` after that round of
batches began, a row announced to an idle relay at once, and a stop ends the wait (docs/architecture.md: The
outbox). The relay runs against the real Postgres and RabbitMQ, with polling off, so that only the tests'
own rows wake it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest

from services.relay.relay import Batch, Relay
from shared import broker
from shared.repository import outbox
from shared.settings import Settings
from tests.support import wait_for

# Far longer than any wait of these tests: a linger or a poll that applied where it should not would show.
LONG_SECONDS = 600.0
# How long a relay that did not linger is given to claim a row it was told of; it takes milliseconds.
OBSERVED_SECONDS = 1.0


class WatchedRelay(Relay):
    """A relay that records the rows each of its rounds handled (``rounds``, appended as a round ends, before
    the relay decides whether to linger) and, with ``announce``, enqueues one more row (a submit's) during its
    first batch with rows, ending that batch only once it has heard of it.
    """

    def __init__(self, *, pool: asyncpg.Pool, announce: bool, **kwargs: Any) -> None:
        super().__init__(pool=pool, **kwargs)
        self.pool = pool
        self.announce = announce
        self.rounds: list[int] = []
        self.wake: asyncio.Event | None = None

    async def _ensure_listener(self, listener: asyncpg.Connection | None, wake: asyncio.Event) -> Any:
        self.wake = wake
        return await super()._ensure_listener(listener, wake)

    async def publish_due(self) -> Batch:
        batch = await super().publish_due()
        if self.announce and batch.handled and not any(self.rounds):
            async with self.pool.acquire() as conn:
                await outbox.enqueue_run(conn, operation_id="op_announced")
            wake = self.wake
            assert wake is not None
            await wait_for(wake.is_set)
        return batch

    async def _publish_all(self) -> Batch:
        batches = await super()._publish_all()
        self.rounds.append(batches.handled)
        return batches


async def published(pool: asyncpg.Pool, operation_id: str) -> bool:
    at = await pool.fetchval("SELECT published_at FROM outbox WHERE operation_id = $1", operation_id)
    return at is not None


@asynccontextmanager
async def running(
    settings: Settings, pool: asyncpg.Pool, *, linger: float, announce: bool
) -> AsyncIterator[tuple[WatchedRelay, asyncio.Event, asyncio.Task[None]]]:
    """A ``WatchedRelay`` with ``relay_linger_seconds`` at ``linger`` and no polling, running until the block
    ends; yielded once its first round, the empty one at its start, has ended, so that it listens.
    """
    watched = settings.model_copy(update={"relay_linger_seconds": linger, "relay_poll_seconds": LONG_SECONDS})
    stop = asyncio.Event()
    session = await broker.open_session_when_ready(watched, name="relay under test", stop=stop, on_return_raises=True)
    try:
        relay = WatchedRelay(
            pool=pool, announce=announce, channel=session.channel, exchange=session.exchange, settings=watched
        )
        task = asyncio.create_task(relay.run(stop=stop))
        try:
            await wait_for(lambda: relay.rounds, timeout=30)
            yield relay, stop, task
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
    finally:
        await session.connection.close()


async def test_rows_announced_to_an_idle_relay_go_out_at_once_whatever_the_linger(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with running(settings, pool, linger=LONG_SECONDS, announce=False):
        for operation_id in ("op_1", "op_2"):
            async with pool.acquire() as conn:
                await outbox.enqueue_run(conn, operation_id=operation_id)
            await wait_for(functools.partial(published, pool, operation_id), timeout=30)


async def test_a_row_announced_during_a_round_waits_for_the_linger_then_goes_out(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    linger = 5 * OBSERVED_SECONDS
    async with running(settings, pool, linger=linger, announce=True) as (relay, _, _):
        async with pool.acquire() as conn:
            await outbox.enqueue_run(conn, operation_id="op_first")
        await wait_for(lambda: any(relay.rounds), timeout=30)
        assert await published(pool, "op_first")
        with pytest.raises(AssertionError, match="not met"):
            await wait_for(lambda: published(pool, "op_announced"), timeout=OBSERVED_SECONDS)
        await wait_for(lambda: published(pool, "op_announced"), timeout=30)
        await wait_for(lambda: relay.rounds == [0, 1, 1], timeout=30)


async def test_a_stop_ends_the_linger(settings: Settings, pool: asyncpg.Pool) -> None:
    async with running(settings, pool, linger=LONG_SECONDS, announce=True) as (relay, stop, task):
        async with pool.acquire() as conn:
            await outbox.enqueue_run(conn, operation_id="op_first")
        await wait_for(lambda: any(relay.rounds), timeout=30)
        stop.set()  # the relay lingers now: it decides as soon as the round ends, before this task runs again
        await asyncio.wait_for(task, 10)
        assert not await published(pool, "op_announced")
        assert relay.rounds == [0, 1]
