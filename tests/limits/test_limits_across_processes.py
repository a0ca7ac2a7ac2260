"""Rate limits across API processes (docs/api.md: Rate limits, Across processes): two api processes with pools of
their own, one of them with its wall clock ten minutes ahead, hammered by one user at once."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from email.utils import parsedate_to_datetime
from pathlib import Path

import aiohttp
import asyncpg
import http_sfv
import pytest

from devtools.broker import delete_broker_objects
from devtools.localsystem import LocalSystem
from devtools.moto import MotoServer
from shared.storage import ensure_bucket, open_s3_client
from tests.chaos.faults import faketime_library
from tests.support import AMQP_URL, cloned_database
from tests.support.e2e import headers_for

pytestmark = pytest.mark.e2e

SUBMITS = 12
POLLS = 60
BATCH = 5
WINDOW_SECONDS = 3600
# The second process's wall clock: ten minutes ahead (libfaketime), its monotonic clock left alone.
SKEW = {"FAKETIME": "+600", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


@pytest.fixture
async def two_apis(template_db: str, moto: MotoServer, tmp_path: Path) -> AsyncIterator[tuple[LocalSystem, str, str]]:
    """Two api processes on one database, the second with a skewed clock; their base URLs."""
    overrides = {
        "CHATEXPORT_RATE_LIMIT_SUBMITS": str(SUBMITS),
        "CHATEXPORT_RATE_LIMIT_SUBMITS_WINDOW_SECONDS": str(WINDOW_SECONDS),
        "CHATEXPORT_RATE_LIMIT_POLLS": str(POLLS),
        "CHATEXPORT_RATE_LIMIT_POLLS_WINDOW_SECONDS": str(WINDOW_SECONDS),
        "CHATEXPORT_RATE_LIMIT_BATCH": str(BATCH),
        "CHATEXPORT_MAX_ACTIVE_EXPORTS": "1000",
        # This test counts: a take slowed past the default 0.5 s by a busy machine would let its polls through
        # uncounted and without fields (fail-open, tested on its own in test_rate_limits.py).
        "CHATEXPORT_RATE_LIMIT_TIMEOUT_SECONDS": "10",
    }
    async with cloned_database(template_db, "chatexport_limits") as database_url:
        local = LocalSystem(database_url=database_url, amqp_url=AMQP_URL, log_dir=tmp_path, overrides=overrides)
        try:
            local.start_storage(moto)
            async with open_s3_client(local.settings()) as s3:
                await ensure_bucket(s3, local.settings().s3_bucket)
            local.start_part("api", name="api")
            local.start_part("api", name="api-skewed", extra_env={"LD_PRELOAD": faketime_library(), **SKEW})
            await asyncio.to_thread(local.wait_ready, ["api", "api-skewed"])
            yield local, local.api_url("api"), local.api_url("api-skewed")
        finally:
            codes = await asyncio.to_thread(local.stop)
            await delete_broker_objects(local.settings())
            assert all(code in (0, -15) for code in codes.values()), codes


async def windows_touched(conn: asyncpg.Connection, started: float) -> int:
    """The windows of ``WINDOW_SECONDS`` from ``started`` (epoch seconds, the database's clock) to now."""
    now = float(await conn.fetchval("SELECT extract(epoch FROM statement_timestamp())"))
    return math.floor(now / WINDOW_SECONDS) - math.floor(started / WINDOW_SECONDS) + 1


def reset_of(response: aiohttp.ClientResponse, policy: str) -> int:
    items = http_sfv.List()
    items.parse(response.headers["RateLimit"].encode())
    return int(next(item.params["t"] for item in items if item.value == policy))


async def test_one_user_hammering_two_processes_never_gets_more_than_the_policy(
    two_apis: tuple[LocalSystem, str, str],
) -> None:
    local, first, second = two_apis
    auth = headers_for(local)
    conn = await asyncpg.connect(local.settings().database_url)
    try:
        started = float(await conn.fetchval("SELECT extract(epoch FROM statement_timestamp())"))
        async with aiohttp.ClientSession() as session:
            put = await session.put(
                f"{first}/admin/conversations/c-a", json={"members": ["alice", "bob"]}, headers=auth("root", admin=True)
            )
            assert put.status == 204, await put.text()
            # The skew took: the second process's Date is ten minutes ahead of the first's.
            dates = []
            for base in (first, second):
                async with session.get(f"{base}/healthz") as health:
                    dates.append(parsedate_to_datetime(health.headers["Date"]))
            assert (dates[1] - dates[0]).total_seconds() >= 590, dates

            async def submit(base: str, n: int) -> int:
                headers = {**auth("alice"), "Idempotency-Key": f"k-{n}"}
                async with session.post(f"{base}/v3/conversations/c-a/exports", json={}, headers=headers) as answer:
                    await answer.read()
                    return answer.status

            submits = await asyncio.gather(*(submit((first, second)[n % 2], n) for n in range(3 * SUBMITS)))

            async def poll(base: str) -> tuple[int, int | None]:
                async with session.get(f"{base}/v3/operations", headers=auth("alice")) as answer:
                    await answer.read()
                    return answer.status, reset_of(answer, "polls") if answer.status == 200 else None

            polls = await asyncio.gather(*(poll((first, second)[n % 2]) for n in range(3 * POLLS)))
            # The other user has an allowance of their own, on either process.
            for base in (first, second):
                async with session.get(f"{base}/v3/operations", headers=auth("bob")) as other:
                    assert other.status == 200
        windows = await windows_touched(conn, started)
    finally:
        await conn.close()
    assert set(submits) <= {202, 429} and set(status for status, _ in polls) <= {200, 429}
    accepted_submits = submits.count(202)
    accepted_polls = sum(1 for status, _ in polls if status == 200)
    # Submits are exact; polls never exceed the policy either (docs/api.md: Rate limits, Across processes), and
    # a process's unused batch may refuse up to one batch per process early.
    assert accepted_submits == SUBMITS * windows or (windows > 1 and accepted_submits <= SUBMITS * windows)
    assert POLLS - 2 * BATCH <= accepted_polls <= POLLS * windows
    # Both processes count in the database's window, whatever their own clocks say.
    resets = {reset for status, reset in polls if reset is not None}
    assert max(resets) - min(resets) <= 5, resets
