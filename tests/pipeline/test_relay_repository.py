"""The relay's claim on a real Postgres: which rows it locks, and how long it may wait before the next outbox
row is due."""

from __future__ import annotations

import asyncpg

from shared.repository import outbox
from tests.support.rows import insert_outbox_row


async def test_an_empty_outbox_has_nothing_due_so_the_relay_waits_its_poll_interval(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn, conn.transaction():
        assert await outbox.claim_due(conn, limit=10) == outbox.Claim(rows=[], next_due_seconds=None)


async def test_the_wait_lasts_until_the_earliest_row_left_is_due_and_never_goes_negative(pool: asyncpg.Pool) -> None:
    await insert_outbox_row(pool, "30 seconds")
    await insert_outbox_row(pool, "10 seconds")
    async with pool.acquire() as conn, conn.transaction():
        claim = await outbox.claim_due(conn, limit=10)
        assert claim.rows == []
        assert 9 < (claim.next_due_seconds or 0) <= 10
    await insert_outbox_row(pool, "-5 seconds")
    await insert_outbox_row(pool, "-1 seconds")
    async with pool.acquire() as conn, conn.transaction():
        claim = await outbox.claim_due(conn, limit=1)
        assert len(claim.rows) == 1
        assert claim.next_due_seconds == 0  # the other overdue row, not claimed: no negative wait
    async with pool.acquire() as conn, conn.transaction():
        claim = await outbox.claim_due(conn, limit=10)
        assert len(claim.rows) == 2
        assert 9 < (claim.next_due_seconds or 0) <= 10  # the claimed rows do not count


async def test_a_due_row_another_relay_holds_reads_as_due_now(pool: asyncpg.Pool) -> None:
    await insert_outbox_row(pool, "-1 seconds")
    async with pool.acquire() as holder, holder.transaction():
        assert len((await outbox.claim_due(holder, limit=10)).rows) == 1
        async with pool.acquire() as other, other.transaction():
            # Skipped, but due: if its holder dies, the other relay claims it at once, not a poll later.
            assert await outbox.claim_due(other, limit=10) == outbox.Claim(rows=[], next_due_seconds=0)


async def test_a_dead_lettered_row_is_never_waited_for(pool: asyncpg.Pool) -> None:
    await insert_outbox_row(pool, "-1 seconds")
    async with pool.acquire() as conn, conn.transaction():
        claim = await outbox.claim_due(conn, limit=10)
        await outbox.put_back(conn, outbox_ids=[row.outbox_id for row in claim.rows], retry_seconds=5, limit=1)
    async with pool.acquire() as conn, conn.transaction():
        assert await outbox.claim_due(conn, limit=10) == outbox.Claim(rows=[], next_due_seconds=None)
