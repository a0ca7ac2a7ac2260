"""The command-line client waits as the API's rate limits ask (docs/api.md: Rate limits): a 429's ``Retry-After``
is waited out, plus jitter and never less, and the poll tried again instead of failing; a ``RateLimit`` field that
shows a policy spent (``r=0``) holds the next poll back until its ``t`` has passed. Against an in-process stand-in
for the API's waiting routes, on a clock that moves only when the client sleeps.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from chatexport.client.api import Api, ApiError
from chatexport.client.progress import Clock
from chatexport.client.ratelimit import renewal_seconds
from chatexport.client.waiting import JITTER, jittered, poll_delay, until_terminal
from services.api.http.rate_fields import LIMIT_FIELD, rate_limit_fields
from services.api.limiting.policies import Policy, Standing
from shared.rate_policies import PolicyName

# More sleeps than any test here needs: a wait that spins fails instead of hanging.
MAX_SLEEPS = 20
SAMPLES = 200


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ('"polls";r=0;t=18;pk=:AAAA:', 18),
        ('"polls";r=42;t=18;pk=:AAAA:', None),
        # Every spent policy must have renewed: the latest of them.
        ('"polls";r=0;t=18, "downloads";r=3;t=900, "submits";r=0;t=3600', 3600),
        # Spent with no time at which it gives any back (a bound on what is held at once): nothing to wait for.
        ('"open-waiters";r=0;pk=:AAAA:', None),
        ('"polls";r=0;t=0', 0),
        # A Boolean is not the Integer 0; seconds are Integers.
        ('"polls";r=?0;t=18', None),
        ('"polls";r=0;t=18.5', None),
        ('"polls";r=0;t=-3', None),
        ('"polls";r=0;t=18,', None),
        ("polls=18", None),
        ("", None),
    ],
)
def test_the_ratelimit_field_says_how_long_its_spent_policies_hold_polls_back(value: str, seconds: int | None) -> None:
    assert renewal_seconds(value) == seconds


def test_the_field_the_api_writes_is_the_field_the_client_reads() -> None:
    polls = Policy(PolicyName.POLLS, quota=600, window_seconds=60)
    downloads = Policy(PolicyName.DOWNLOADS, quota=100, window_seconds=3600)
    spent = rate_limit_fields([Standing(polls, 0, 17.2), Standing(downloads, 7, 1200.0)], b"partition")
    assert renewal_seconds(spent[LIMIT_FIELD]) == 18
    left = rate_limit_fields([Standing(polls, 1, 17.2)], b"partition")
    assert renewal_seconds(left[LIMIT_FIELD]) is None


def test_a_wait_is_never_shorter_than_asked_and_at_most_a_quarter_longer() -> None:
    assert JITTER == (1.0, 1.25)
    refused = ApiError(429, "RATE_LIMITED", "Too many polls", retry_after=30)
    broken = TimeoutError()
    for _ in range(SAMPLES):
        assert 18 <= jittered(18) <= 22.5
        # A 429's Retry-After, whatever the operation asked.
        assert 30 <= poll_delay({"next_poll_after_seconds": 2}, refused, 0) <= 37.5
        # A spent policy outlasts next_poll_after_seconds; the longer of the two is waited.
        assert 18 <= poll_delay({"next_poll_after_seconds": 2}, broken, 18) <= 22.5
        assert 5 <= poll_delay({"next_poll_after_seconds": 5}, broken, 1) <= 6.25
        assert 30 <= poll_delay({"next_poll_after_seconds": 2}, refused, 18) <= 37.5


class FakeClock(Clock):
    """Time that moves only when the code under test sleeps, by as long as it asks."""

    def __init__(self) -> None:
        self.time = 0.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        assert len(self.sleeps) < MAX_SLEEPS, "the wait spins"
        self.sleeps.append(seconds)
        self.time += max(seconds, 0.0)


@dataclass(frozen=True)
class Answer:
    """One answer of the stand-in: its status, body (an operation, or a problem) and fields; a stream that
    is answered 200 sends the body as its one event, then ends.
    """

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class WaitingRoutes:
    """The stream, long poll and poll of one operation, each answering from its own ``scripts`` in turn (its last
    answer again once the others are spent); ``asked`` is each request's route and the clock's time at it.
    """

    clock: FakeClock
    scripts: dict[str, list[Answer]]
    asked: list[tuple[str, float]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v3/operations/{id}", self._answer)
        app.router.add_get("/v3/operations/{id}/events", self._answer)
        return app

    async def _answer(self, request: web.Request) -> web.Response:
        route = "stream" if request.path.endswith("/events") else "long poll" if "wait" in request.query else "poll"
        self.asked.append((route, self.clock.time))
        script = self.scripts[route]
        answer = script.pop(0) if len(script) > 1 else script[0]
        if route == "stream" and answer.status == 200:
            event = f"data: {json.dumps(answer.body)}\n\n"
            return web.Response(text=event, content_type="text/event-stream", headers=answer.headers)
        return web.json_response(answer.body, status=answer.status, headers=answer.headers)


def running(**members: Any) -> dict[str, Any]:
    return {"operation_id": "op_1", "state": "RUNNING", "done": False, "next_poll_after_seconds": 2, **members}


SUCCEEDED = {"operation_id": "op_1", "state": "SUCCEEDED", "done": True}


def rate_limited(seconds: int) -> Answer:
    return Answer(
        429,
        {"code": "RATE_LIMITED", "detail": "Too many polls.", "violated-policies": ["polls"]},
        {"Retry-After": str(seconds), "RateLimit": f'"polls";r=0;t={seconds};pk=:AAAA:'},
    )


UNAVAILABLE = Answer(503, {"code": "SERVICE_UNAVAILABLE", "detail": "Try again."})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def follow(routes: WaitingRoutes) -> tuple[dict[str, Any], list[str]]:
    """Run ``until_terminal`` against ``routes``: the last representation, and the states it observed."""
    seen: list[str] = []
    async with TestServer(routes.app()) as server, Api(str(server.make_url("")), "token", clock=routes.clock) as api:
        async with asyncio.timeout(10):
            last = await until_terminal(api, running(), lambda operation: seen.append(operation["state"]))
    return last, seen


def gaps(asked: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Each request's route and the time since the one before it."""
    return [(route, at - before) for (route, at), (_, before) in zip(asked, [("", 0.0), *asked], strict=False)]


async def test_429s_are_waited_out_for_their_retry_after_and_the_poll_tried_again(clock: FakeClock) -> None:
    routes = WaitingRoutes(
        clock,
        {
            "stream": [rate_limited(20)],
            "long poll": [rate_limited(15)],
            "poll": [rate_limited(10), Answer(200, SUCCEEDED)],
        },
    )
    last, seen = await follow(routes)
    assert (last, seen) == (SUCCEEDED, ["RUNNING", "SUCCEEDED"])
    asked = gaps(routes.asked)
    assert [route for route, _ in asked] == ["stream", "long poll", "poll", "poll"]
    # Each request came no sooner than the 429 before it asked, and at most a quarter later.
    for (_, waited), retry_after in zip(asked[1:], (20, 15, 10), strict=True):
        assert retry_after <= waited <= retry_after * JITTER[1]


async def test_a_429_without_retry_after_still_fails_the_wait(clock: FakeClock) -> None:
    refused = Answer(429, {"code": "TOO_MANY_REQUESTS", "detail": "Slow down."})
    routes = WaitingRoutes(clock, {"stream": [UNAVAILABLE], "long poll": [UNAVAILABLE], "poll": [refused]})
    with pytest.raises(ApiError) as raised:
        await follow(routes)
    assert (raised.value.status, raised.value.retry_after) == (429, None)


async def test_a_spent_policy_holds_the_next_poll_back_until_it_renews(clock: FakeClock) -> None:
    spent = {"RateLimit": '"polls";r=0;t=40;pk=:AAAA:'}
    routes = WaitingRoutes(
        clock,
        {
            "stream": [UNAVAILABLE],
            "long poll": [Answer(200, running(), spent), UNAVAILABLE],
            "poll": [Answer(200, running(), spent), Answer(200, SUCCEEDED)],
        },
    )
    last, seen = await follow(routes)
    assert (last, seen) == (SUCCEEDED, ["RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"])
    asked = gaps(routes.asked)
    routes_asked = [route for route, _ in asked]
    assert routes_asked == ["stream", "long poll", "stream", "long poll", "poll", "stream", "long poll", "poll"]
    # After each answer that showed the policy spent: t, not the operation's next_poll_after_seconds of 2.
    assert 40 <= asked[2][1] <= 40 * JITTER[1]
    assert 40 <= asked[5][1] <= 40 * JITTER[1]
    # Once it renewed, the stream is tried again at once, and a refused poll waits what the operation asks.
    assert (asked[1][1], asked[3][1], asked[6][1]) == (0, 0, 0)
    assert 2 <= asked[4][1] <= 2 * JITTER[1]
    assert 2 <= asked[7][1] <= 2 * JITTER[1]


async def test_a_field_that_does_not_parse_holds_nothing_back(clock: FakeClock) -> None:
    garbled = {"RateLimit": "polls;r=0;t=40;;"}
    routes = WaitingRoutes(
        clock, {"stream": [UNAVAILABLE], "long poll": [Answer(200, running(), garbled), Answer(200, SUCCEEDED)]}
    )
    last, _ = await follow(routes)
    assert last == SUCCEEDED
    assert gaps(routes.asked) == [("stream", 0), ("long poll", 0), ("stream", 0), ("long poll", 0)]
    assert clock.sleeps == []


async def test_the_renewal_counts_from_the_answer_that_showed_it(clock: FakeClock) -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.json_response(running(), headers={"RateLimit": '"polls";r=0;t=40'})

    app = web.Application()
    app.router.add_get("/v3/operations/{id}", answer)
    async with TestServer(app) as server, Api(str(server.make_url("")), "token", clock=clock) as api:
        assert api.polls_renew_in() == 0
        await api.operation("op_1")
        assert api.polls_renew_in() == 40
        clock.time += 15
        assert api.polls_renew_in() == 25
        clock.time += 30
        assert api.polls_renew_in() == 0
