"""Each user's rate limits on one API (docs/api.md: Rate limits): polls, submits, the storage budget, the
fields and the 429, tokens that count nothing, the limiter's store failing, and ``GET /v3/limits``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import http_sfv
from aiohttp.test_utils import TestClient, TestServer

from services.api.app import init_app
from services.api.http.metrics import RATE_LIMIT_STORE_FAILURES
from shared.settings import Settings
from tests.support.api_calls import expect_problem, make_conversation, submit

Client = TestClient[Any, Any]
Auth = Callable[..., dict[str, str]]


@contextlib.asynccontextmanager
async def limited_api(settings: Settings, **overrides: Any) -> AsyncIterator[Client]:
    """The API on the test's database with ``overrides`` to its settings."""
    async with TestClient(TestServer(init_app(settings.model_copy(update=overrides)))) as client:
        yield client


def parsed(value: str) -> dict[str, dict[str, Any]]:
    """A rate-limit field's items by policy name, each its parameters, as a Structured Fields parser reads it."""
    items = http_sfv.List()
    items.parse(value.encode())
    return {item.value: dict(item.params) for item in items}


async def database_window_end(pool: asyncpg.Pool, user_id: str, policy: str, window_seconds: int) -> float:
    """Seconds from the database's now to the end of ``user_id``'s window of ``policy``."""
    value = await pool.fetchval(
        "SELECT extract(epoch FROM window_start + make_interval(secs => $3) - statement_timestamp())"
        " FROM rate_limit_windows WHERE user_id = $1 AND policy = $2",
        user_id,
        policy,
        window_seconds,
    )
    return float(value)


async def test_polls_over_the_policy_get_429_naming_it_with_retry_after_past_the_window(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool
) -> None:
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    async with limited_api(settings, rate_limit_polls=4, rate_limit_polls_window_seconds=3600) as limited:
        remaining = []
        for _ in range(4):
            answer = await limited.get("/v3/operations", headers=auth("alice"))
            assert answer.status == 200
            policy = parsed(answer.headers["RateLimit-Policy"])
            assert policy["polls"]["q"] == 4 and policy["polls"]["w"] == 3600
            remaining.append(parsed(answer.headers["RateLimit"])["polls"]["r"])
        assert remaining == [3, 2, 1, 0]
        before = await database_window_end(pool, "alice", "polls", 3600)
        refused = await limited.get("/v3/operations", headers=auth("alice"))
        body = await expect_problem(refused, 429, "RATE_LIMITED")
        assert body["violated-policies"] == ["polls"]
        assert int(refused.headers["Retry-After"]) >= before
        assert parsed(refused.headers["RateLimit"])["polls"]["r"] == 0
        assert parsed(refused.headers["RateLimit"])["polls"]["t"] >= before - 1
        # Another user's allowance is their own.
        assert (await limited.get("/v3/operations", headers=auth("bob"))).status == 200


async def test_requests_without_a_valid_token_spend_nothing(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool
) -> None:
    async with limited_api(settings, rate_limit_polls=2, rate_limit_batch=1) as limited:
        forged = {"Authorization": auth("alice")["Authorization"][:-4] + "AAAA"}
        for headers in ({}, forged, {"Authorization": "Bearer nonsense"}) * 5:
            await expect_problem(await limited.get("/v3/operations", headers=headers), 401, "UNAUTHENTICATED")
        assert await pool.fetchval("SELECT count(*) FROM rate_limit_windows") == 0
        for _ in range(2):
            assert (await limited.get("/v3/operations", headers=auth("alice"))).status == 200


async def test_admin_tokens_are_exempt_unless_the_setting_says_otherwise(
    api: Client, auth: Auth, settings: Settings
) -> None:
    async with limited_api(settings, rate_limit_polls=1) as limited:
        for _ in range(3):
            answer = await limited.get("/v3/operations", headers=auth("root", admin=True))
            assert answer.status == 200 and "RateLimit" not in answer.headers
    async with limited_api(settings, rate_limit_polls=1, rate_limit_admin_exempt=False) as limited:
        assert (await limited.get("/v3/operations", headers=auth("root", admin=True))).status == 200
        await expect_problem(await limited.get("/v3/operations", headers=auth("root", admin=True)), 429, "RATE_LIMITED")


async def test_the_fields_can_be_turned_off_while_the_limit_holds(api: Client, auth: Auth, settings: Settings) -> None:
    async with limited_api(settings, rate_limit_polls=1, rate_limit_fields=False) as limited:
        answer = await limited.get("/v3/operations", headers=auth("alice"))
        assert answer.status == 200 and "RateLimit" not in answer.headers and "RateLimit-Policy" not in answer.headers
        refused = await limited.get("/v3/operations", headers=auth("alice"))
        await expect_problem(refused, 429, "RATE_LIMITED")
        assert "RateLimit" not in refused.headers and int(refused.headers["Retry-After"]) >= 1


async def test_submits_are_counted_exactly_and_a_replay_counts_nothing(
    api: Client, auth: Auth, settings: Settings
) -> None:
    await make_conversation(api, auth, "c-a", ["alice"])
    async with limited_api(settings, rate_limit_submits=2, max_active_exports=10) as limited:
        first = await submit(limited, auth, "alice", "c-a", {}, "k-1")
        assert first.status == 202
        assert parsed(first.headers["RateLimit"])["submits"]["r"] == 1
        for _ in range(3):
            assert (await submit(limited, auth, "alice", "c-a", {}, "k-1")).status == 202  # replays
        assert (await submit(limited, auth, "alice", "c-a", {}, "k-2")).status == 202
        refused = await submit(limited, auth, "alice", "c-a", {}, "k-3")
        body = await expect_problem(refused, 429, "RATE_LIMITED")
        assert body["violated-policies"] == ["submits"]
        assert int(refused.headers["Retry-After"]) >= parsed(refused.headers["RateLimit"])["submits"]["t"] - 1
        # Refused: nothing was created under the key, which a later window may still use.
        assert (await limited.get("/v3/operations", headers=auth("alice"))).status == 200
        listed = await (await limited.get("/v3/operations", headers=auth("alice"))).json()
        assert len(listed["operations"]) == 2


async def test_a_spent_storage_budget_refuses_a_submit_and_says_so(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool
) -> None:
    await make_conversation(api, auth, "c-a", ["alice"])
    async with limited_api(settings, rate_limit_content_bytes=1000) as limited:
        first = await submit(limited, auth, "alice", "c-a", {}, "k-1")
        assert first.status == 202
        assert parsed(first.headers["RateLimit"])["content-bytes"]["r"] == 1000
        assert parsed(first.headers["RateLimit-Policy"])["content-bytes"]["qu"] == "content-bytes"
        await pool.execute("UPDATE operations SET bytes_written = 1000 WHERE owner_id = 'alice'")
        refused = await submit(limited, auth, "alice", "c-a", {}, "k-2")
        body = await expect_problem(refused, 429, "CONTENT_BYTES_SPENT")
        assert body["violated-policies"] == ["content-bytes"]
        assert int(refused.headers["Retry-After"]) >= 60
        assert parsed(refused.headers["RateLimit"])["content-bytes"]["r"] == 0
        assert await pool.fetchval("SELECT count(*) FROM operations") == 1


async def test_the_per_user_bounds_of_before_name_their_policy(api: Client, auth: Auth, settings: Settings) -> None:
    await make_conversation(api, auth, "c-a", ["alice"])
    async with limited_api(settings, max_active_exports=1) as limited:
        assert (await submit(limited, auth, "alice", "c-a", {}, "k-1")).status == 202
        refused = await submit(limited, auth, "alice", "c-a", {}, "k-2")
        body = await expect_problem(refused, 429, "TOO_MANY_ACTIVE_EXPORTS")
        assert body["violated-policies"] == ["active-exports"]
        assert parsed(refused.headers["RateLimit-Policy"])["active-exports"] == {
            "q": 1,
            "qu": "concurrent-requests",
            "pk": parsed(refused.headers["RateLimit"])["active-exports"]["pk"],
        }
        assert refused.headers["Retry-After"] == "10"


async def test_limits_shows_every_policy_and_what_remains(api: Client, auth: Auth, settings: Settings) -> None:
    await make_conversation(api, auth, "c-a", ["alice"])
    async with limited_api(settings, rate_limit_submits=5, rate_limit_polls=50, rate_limit_batch=1) as limited:
        assert (await submit(limited, auth, "alice", "c-a", {}, "k-1")).status == 202
        answer = await limited.get("/v3/limits", headers=auth("alice"))
        assert answer.status == 200
        body = await answer.json()
        shown = {entry["policy"]: entry for entry in body["policies"]}
        assert body["exempt"] is False
        assert shown["submits"]["remaining"] == 4 and shown["submits"]["window_seconds"] == 3600
        assert shown["polls"]["remaining"] == 49  # this request was a poll
        assert shown["active-exports"]["remaining"] == settings.max_active_exports - 1
        assert shown["content-bytes"]["unit"] == "content-bytes"
        assert set(shown) == {
            "submits",
            "polls",
            "downloads",
            "content-bytes",
            "active-exports",
            "open-downloads",
            "open-waiters",
            "open-uploads",
        }


# The limiter's deadline where a test makes its store fail by locking a window: a request on a locked window
# waits this long, and one on a free window must never reach it, even on a loaded machine where the pool's first
# connection and statement take a few hundred milliseconds.
STORE_DEADLINE_SECONDS = 2.0


async def _locked_window(pool: asyncpg.Pool, user_id: str, policy: str) -> AsyncIterator[None]:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "SELECT 1 FROM rate_limit_windows WHERE user_id = $1 AND policy = $2 FOR UPDATE", user_id, policy
        )
        yield


async def test_a_store_failure_lets_polls_through_when_open_with_one_statement_per_user(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool
) -> None:
    overrides = {"rate_limit_polls": 100, "rate_limit_batch": 1, "rate_limit_timeout_seconds": STORE_DEADLINE_SECONDS}
    async with limited_api(settings, **overrides) as limited:
        assert (await limited.get("/v3/operations", headers=auth("alice"))).status == 200
        failures = RATE_LIMIT_STORE_FAILURES.labels("polls")._value.get()
        async with contextlib.asynccontextmanager(_locked_window)(pool, "alice", "polls"):
            answers = await asyncio.gather(*(limited.get("/v3/operations", headers=auth("alice")) for _ in range(8)))
        assert [answer.status for answer in answers] == [200] * 8
        assert all("RateLimit" not in answer.headers for answer in answers)
        # Eight requests waited on one statement: one failure.
        assert RATE_LIMIT_STORE_FAILURES.labels("polls")._value.get() == failures + 1


async def test_a_store_failure_refuses_polls_when_closed(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool
) -> None:
    overrides = {
        "rate_limit_batch": 1,
        "rate_limit_timeout_seconds": STORE_DEADLINE_SECONDS,
        "rate_limit_on_store_failure": "closed",
    }
    async with limited_api(settings, **overrides) as limited:
        assert (await limited.get("/v3/operations", headers=auth("alice"))).status == 200
        async with contextlib.asynccontextmanager(_locked_window)(pool, "alice", "polls"):
            refused = await limited.get("/v3/operations", headers=auth("alice"))
            await expect_problem(refused, 503, "SERVICE_UNAVAILABLE")
            # Another user's window is not locked.
            assert (await limited.get("/v3/operations", headers=auth("bob"))).status == 200
        assert (await limited.get("/v3/operations", headers=auth("alice"))).status == 200
