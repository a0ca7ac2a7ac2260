"""The relay's SQL on a real Postgres: how long it may wait before the next outbox row is due."""

from __future__ import annotations

import asyncpg

from shared.repository import outbox
from tests.support.rows import insert_outbox_row


async def test_an_empty_outbox_has_nothing_due_so_the_relay_waits_its_poll_interval(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        assert await outbox.seconds_until_next_due(conn) is None


async def test_the_wait_lasts_until_the_earliest_row_is_due_and_never_goes_negative(pool: asyncpg.Pool) -> None:
    await insert_outbox_row(pool, "30 seconds")
    await insert_outbox_row(pool, "10 seconds")
    async with pool.acquire() as conn:
        assert 9 < (await outbox.seconds_until_next_due(conn) or 0) <= 10
        await insert_outbox_row(pool, "-5 seconds")
        assert await outbox.seconds_until_next_due(conn) == 0
