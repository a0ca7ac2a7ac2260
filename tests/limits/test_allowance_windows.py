"""The window a take counts in (docs/api.md: Rate limits, Windows): never one that moved back, the row's own
length until it ends, and quotas as large as the fields can show."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import asyncpg
import pydantic
import pytest
from aiohttp.test_utils import TestClient, TestServer

from services.api.app import init_app
from services.api.limiting.limiter import RateLimiter
from services.api.limiting.policies import policies
from shared.rate_policies import PolicyName
from shared.repository.rate_limits import take_allowance
from shared.settings import MAX_QUOTA, Settings
from tests.limits.test_rate_limits import parsed
from tests.support import wait_for
from tests.support.api_calls import make_conversation, submit


async def _row(pool: asyncpg.Pool, *, start_sql: str, window_seconds: int, used: int) -> None:
    await pool.execute(
        "INSERT INTO rate_limit_windows (user_id, policy, window_start, window_seconds, used)"
        f" VALUES ('alice', 'polls', {start_sql}, $1, $2)",
        window_seconds,
        used,
    )


async def test_a_take_never_moves_a_window_back(pool: asyncpg.Pool) -> None:
    # The row already holds the next window (a take that began before the edge waited for the lock past it).
    start = "to_timestamp(floor(extract(epoch FROM clock_timestamp()) / 60) * 60 + 60)"
    await _row(pool, start_sql=start, window_seconds=60, used=10)
    async with pool.acquire() as conn:
        taken = await take_allowance(conn, user_id="alice", policy="polls", quota=10, window_seconds=60, wanted=5)
    assert taken.granted == 0 and taken.remaining == 0 and taken.reset_seconds > 60
    assert await pool.fetchval("SELECT used FROM rate_limit_windows") == 10


async def test_a_window_of_another_length_is_counted_into_until_it_ends(pool: asyncpg.Pool) -> None:
    await _row(pool, start_sql="clock_timestamp() - interval '1 minute'", window_seconds=3600, used=10)
    async with pool.acquire() as conn:
        spent = await take_allowance(conn, user_id="alice", policy="polls", quota=10, window_seconds=60, wanted=1)
        assert spent.granted == 0 and spent.reset_seconds > 3000
        await conn.execute("UPDATE rate_limit_windows SET window_start = clock_timestamp() - interval '2 hours'")
        renewed = await take_allowance(conn, user_id="alice", policy="polls", quota=10, window_seconds=60, wanted=1)
    assert renewed.granted == 1 and renewed.reset_seconds <= 60
    assert await pool.fetchval("SELECT window_seconds FROM rate_limit_windows") == 60


async def test_a_read_takes_nothing_and_writes_nothing(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        read = await take_allowance(conn, user_id="alice", policy="polls", quota=10, window_seconds=60, wanted=0)
    assert (read.granted, read.remaining) == (0, 10)
    assert await pool.fetchval("SELECT count(*) FROM rate_limit_windows") == 0


def test_a_quota_the_fields_cannot_show_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError):
        Settings(environment="development", rate_limit_polls=MAX_QUOTA + 1)
    with pytest.raises(pydantic.ValidationError):
        Settings(environment="development", rate_limit_content_bytes=MAX_QUOTA + 1)


async def test_the_largest_quotas_are_counted_and_shown(api: Any, auth: Any, settings: Settings) -> None:
    await make_conversation(api, auth, "c-a", ["alice"])
    largest = {
        "rate_limit_submits": MAX_QUOTA,
        "rate_limit_polls": MAX_QUOTA,
        "rate_limit_downloads": MAX_QUOTA,
        "rate_limit_content_bytes": MAX_QUOTA,
    }
    async with TestClient(TestServer(init_app(settings.model_copy(update=largest)))) as limited:
        submitted = await submit(limited, auth, "alice", "c-a", {}, "k-1")
        assert submitted.status == 202
        assert parsed(submitted.headers["RateLimit"])["submits"]["r"] == MAX_QUOTA - 1
        polled = await limited.get("/v3/operations", headers=auth("alice"))
        assert polled.status == 200
        assert parsed(polled.headers["RateLimit-Policy"])["polls"]["q"] == MAX_QUOTA


async def test_shares_of_ended_windows_are_dropped(settings: Settings) -> None:
    limited = settings.model_copy(update={"rate_limit_polls": 100, "rate_limit_polls_window_seconds": 1})
    limiter = RateLimiter(limited, sweep_seconds=0.0)
    polls = policies(limited)[PolicyName.POLLS]
    loop = asyncio.get_running_loop()
    await limiter.start()
    try:
        ends = []
        for n in range(30):
            standing = await limiter.admit(f"user-{n}", polls)
            assert standing is not None and standing.reset_seconds is not None
            ends.append(loop.time() + standing.reset_seconds)
        await wait_for(lambda: loop.time() >= max(ends), timeout=5)
        assert await limiter.admit("someone-else", polls) is not None
        # Without the sweep the 30 ended shares would still be held.
        assert limiter.held_shares == 1
    finally:
        await limiter.close()


def test_requests_arriving_as_a_take_ends_never_spin(settings: Settings) -> None:
    """Requests that arrive while a take ends, and spend its share before the take is forgotten, wait for a new
    take: the loop keeps turning (a spin would hold it, so the scenario runs on a loop of its own)."""
    # A take slowed past the default 0.5 s by a busy machine would answer its requests uncounted (fail-open,
    # tested on its own in test_rate_limits.py); this test counts the units granted.
    limited = settings.model_copy(
        update={"rate_limit_polls": 1_000_000, "rate_limit_batch": 2, "rate_limit_timeout_seconds": 10.0}
    )
    polls = policies(limited)[PolicyName.POLLS]
    admitted: list[int] = []

    async def scenario() -> None:
        limiter = RateLimiter(limited)
        await limiter.start()
        try:
            # Rounds of a few new requests on every turn of the loop, so that some are queued behind a take's end.
            for user in ("alice", "bob", "carol"):
                requests: list[asyncio.Task[object]] = []
                for _ in range(300):
                    requests.extend(asyncio.create_task(limiter.admit(user, polls)) for _ in range(3))
                    await asyncio.sleep(0)
                answers = await asyncio.gather(*requests)
                admitted.append(sum(1 for answer in answers if answer is not None))
        finally:
            await limiter.close()

    turning = threading.Thread(target=asyncio.run, args=(scenario(),), daemon=True)
    turning.start()
    turning.join(timeout=30)
    assert not turning.is_alive(), "the limiter's loop stopped turning"
    assert admitted == [900, 900, 900]
