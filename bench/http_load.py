"""Benchmark: polls and submits per second of one api process against a bare aiohttp + asyncpg server doing
the same database work (``bench/bare_server.py``), side by side in one run, under ``wrk -t1 -c32``.

Starts its own system from the compose file on a fresh database, with ``USERS`` users, each a member of a
conversation of 100 messages with one finished export. While wrk runs, the relay, workers and janitor are
stopped (SIGSTOP), so both servers get the same machine and the submits' outbox rows wait; the poll spreads
over every user's operation, the submit over every user with a new Idempotency-Key each time.

The rate limiter's cost to polls (docs/api.md: Rate limits) is measured on the same api process: with it on, the
users' own tokens, each poll counted against a quota so large it never refuses (``SETTINGS``; a batch of
``CHATEXPORT_RATE_LIMIT_BATCH`` taken from the database per user, and the ``RateLimit`` fields on every answer);
with it off, tokens of the same users with the ``admin`` scope, which no policy counts while
``CHATEXPORT_RATE_LIMIT_ADMIN_EXEMPT`` holds (the default) and which read their own operations like any owner.
The two take turns, ``ROUNDS`` rounds, the best of each kept. Needs ``wrk`` (the machine's package manager has
it). Usage:

    .venv/bin/python bench/http_load.py [--seconds N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.running import admin_headers, member_conversation, running_system
from bench.table import Figure, print_table
from devtools.localsystem import LocalSystem
from devtools.ports import free_port
from shared.auth import mint_token

USERS = 200
CONNECTIONS = 32
ROUNDS = 3
# Quotas no run reaches (``bench.running``): every request is counted and none refused, so no 429 is measured.
SETTINGS = {"CHATEXPORT_MAX_ACTIVE_EXPORTS": "1000000", "CHATEXPORT_RATE_LIMIT_POLLS_WINDOW_SECONDS": "60"}


@dataclass(frozen=True)
class Load:
    """What wrk measured: requests per second and latency percentiles (ms)."""

    requests_per_second: float
    p50_ms: float
    p99_ms: float
    non_2xx: int


def wrk(url: str, script: str, seconds: int) -> Load:
    """Run ``wrk -t1 -c32`` for ``seconds`` against ``url`` with the Lua ``script``."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
        lua.write(script)
    output = subprocess.run(
        ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency", "-s", lua.name, url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    Path(lua.name).unlink()
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    return Load(
        float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),  # type: ignore[union-attr]
        _ms(output, "50%"),
        _ms(output, "99%"),
        int(non_2xx.group(1)) if non_2xx else 0,
    )


def _ms(output: str, label: str) -> float:
    value, unit = re.search(rf"{label}\s+([\d.]+)(us|ms|s)", output).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


# (path, headers) of the requests a wrk script cycles through.
Requests = list[tuple[str, dict[str, str]]]


def lua_requests(method: str, requests: Requests, body: str = "", unique_key: bool = False) -> str:
    """A wrk script that cycles through ``requests``; with ``unique_key`` each request gets a new
    ``Idempotency-Key``.
    """
    rows = ",\n".join(f"{{{json.dumps(path)}, {{{_lua_table(headers)}}}}}" for path, headers in requests)
    key = f'h["Idempotency-Key"] = "{uuid.uuid4().hex}-" .. n' if unique_key else ""
    return f"""
local requests = {{ {rows} }}
local n = 0
request = function()
  n = n + 1
  local r = requests[(n % #requests) + 1]
  local h = {{}}
  for k, v in pairs(r[2]) do h[k] = v end
  {key}
  return wrk.format({json.dumps(method)}, r[1], h, {json.dumps(body) if body else "nil"})
end
"""


def _lua_table(headers: dict[str, str]) -> str:
    return ", ".join(f"[{json.dumps(name)}] = {json.dumps(value)}" for name, value in headers.items())


async def prepare(
    system: LocalSystem, *, token_for: Callable[[str], str] | None = None, admin: dict[str, str] | None = None
) -> list[tuple[str, str, str]]:
    """Every user's (token, conversation, finished operation); ``token_for(user)`` gives the tokens and
    ``admin`` the admin's headers (by default both signed with ``system``'s secret).
    """
    settings = system.settings()
    admin = admin or admin_headers(system)
    prepared = []
    async with aiohttp.ClientSession(base_url=system.base_url) as api:
        for number in range(USERS):
            user, cid = f"user-{number}", f"bench-c{number}"
            token = token_for(user) if token_for else mint_token(settings, user_id=user, ttl_seconds=3600)
            await member_conversation(api, admin, user=user, cid=cid, messages=100, body="message")
            headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "prepare"}
            async with api.post(f"/v3/conversations/{cid}/exports", json={}, headers=headers) as r:
                assert r.status == 202, await r.text()
                prepared.append((token, cid, (await r.json())["operation_id"]))
        for token, _, operation_id in prepared:
            state = None
            while state != "SUCCEEDED":
                url = f"/v3/operations/{operation_id}?wait=30"
                async with api.get(url, headers={"Authorization": f"Bearer {token}"}) as r:
                    state = (await r.json())["state"]
    return prepared


@contextlib.contextmanager
def paused_background(system: LocalSystem) -> Iterator[None]:
    """SIGSTOP every part but the api for the block."""
    with system.group.paused([name for name in system.group.pids() if not name.startswith("api")]):
        yield


@contextlib.contextmanager
def bare_server(database_url: str) -> Iterator[str]:
    """The bare server on a free port; yields its base URL."""
    port = free_port("127.0.0.1")
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.bare_server", "--database-url", database_url, "--port", str(port)],
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        asyncio.run(_until_up(url))
        yield url
    finally:
        process.terminate()
        process.wait(10)


async def _until_up(url: str) -> None:
    async with asyncio.timeout(30), aiohttp.ClientSession() as http:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{url}/ops/none"):
                    return
            await asyncio.sleep(0.1)


def poll_requests(prepared: list[tuple[str, str, str]]) -> Requests:
    """``GET /v3/operations/{id}`` of every prepared user's operation, with its token."""
    return [(f"/v3/operations/{op}", {"Authorization": f"Bearer {token}"}) for token, _, op in prepared]


def submit_requests(prepared: list[tuple[str, str, str]]) -> Requests:
    """``POST .../exports`` of every prepared user's conversation, with its token (the key is wrk's to add)."""
    return [
        (f"/v3/conversations/{cid}/exports", {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        for token, cid, _ in prepared
    ]


async def conditional_poll_requests(system: LocalSystem, prepared: list[tuple[str, str, str]]) -> Requests:
    """``poll_requests`` with each operation's current ETag as ``If-None-Match``: every answer a 304
    (docs/api.md: Operations, Conditional polls).
    """
    requests = poll_requests(prepared)
    async with aiohttp.ClientSession(base_url=system.base_url) as api:
        for path, headers in requests:
            async with api.get(path, headers=headers) as response:
                headers["If-None-Match"] = response.headers["ETag"]
    return requests


async def exempt_poll_requests(system: LocalSystem, prepared: list[tuple[str, str, str]]) -> Requests:
    """``poll_requests`` with tokens of the same users that also hold the ``admin`` scope, which the limiter
    does not count: the limiter off. Checks that every such poll is answered 200 without the ``RateLimit``
    fields, and the users' own polls with them (the limiter on).
    """
    settings = system.settings()
    exempt = poll_requests(
        [
            (mint_token(settings, user_id=f"user-{number}", scopes=["admin"], ttl_seconds=3600), cid, operation)
            for number, (_, cid, operation) in enumerate(prepared)
        ]
    )
    async with aiohttp.ClientSession(base_url=system.base_url) as api:
        for requests, counted in ((poll_requests(prepared), True), (exempt, False)):
            for path, headers in requests:
                async with api.get(path, headers=headers) as response:
                    assert response.status == 200, (path, response.status, await response.text())
                    assert ("RateLimit" in response.headers) is counted, (path, dict(response.headers))
    return exempt


def checked(name: str, load: Load) -> Load:
    """``load``, printed as ``name``'s line, once it is known to hold no answer but a 2xx or 3xx."""
    assert load.non_2xx == 0, (name, load)
    print(f"{name:<12} {load.requests_per_second:>9,.0f} req/s  p50 {load.p50_ms:.1f} ms  p99 {load.p99_ms:.1f} ms")
    return load


def limiter_turns(system: LocalSystem, polls: Requests, exempt: Requests, seconds: int) -> tuple[float, float]:
    """The best polls per second with the limiter on (``polls``) and off (``exempt``) over ``ROUNDS`` rounds,
    the two in turns, which goes first alternating; the caller pauses the background.
    """
    scripts = {"limiter off": lua_requests("GET", exempt), "limiter on": lua_requests("GET", polls)}
    best = dict.fromkeys(scripts, 0.0)
    for number in range(ROUNDS):
        for mode in list(scripts)[:: -1 if number % 2 else 1]:
            load = checked(mode, wrk(system.base_url, scripts[mode], seconds))
            best[mode] = max(best[mode], load.requests_per_second)
    return best["limiter on"], best["limiter off"]


def measure(
    system: LocalSystem,
    prepared: list[tuple[str, str, str]],
    conditional: Requests,
    exempt: Requests,
    seconds: int,
) -> list[Figure]:
    """The poll, conditional poll and submit rows, each against the bare server in the same run, and the
    polls with the limiter on against the same polls with it off.
    """
    polls, submits = poll_requests(prepared), submit_requests(prepared)
    bare_polls: Requests = [(f"/ops/{op}", {}) for _, _, op in prepared]
    bare_submits = [
        (f"/submit/{cid}", {"X-User": f"user-{n}", "Content-Type": "application/json"})
        for n, (_, cid, _) in enumerate(prepared)
    ]
    with paused_background(system):
        # First: the submits' rows leave the database writing for a while after, which the limiter's own
        # statements would meet and the exempt polls would not.
        limited, unlimited = limiter_turns(system, polls, exempt, seconds)
        with bare_server(system.settings().database_url) as bare:
            loads = {
                "poll": wrk(system.base_url, lua_requests("GET", polls), seconds),
                "bare poll": wrk(bare, lua_requests("GET", bare_polls), seconds),
                "304 poll": wrk(system.base_url, lua_requests("GET", conditional), seconds),
                "submit": wrk(system.base_url, lua_requests("POST", submits, "{}", unique_key=True), seconds),
                "bare submit": wrk(bare, lua_requests("POST", bare_submits, "{}", unique_key=True), seconds),
            }
        for name, load in loads.items():
            checked(name, load)
    return [
        Figure("GET /v3/operations/{id}, wrk -t1 -c32", loads["poll"].requests_per_second, "req/s",
               loads["bare poll"].requests_per_second, "bare server", ">= 0.7"),
        Figure("GET /v3/operations/{id} answered 304, wrk -t1 -c32", loads["304 poll"].requests_per_second,
               "req/s", loads["bare poll"].requests_per_second, "bare server (200)", "reported"),
        Figure("POST .../exports, wrk -t1 -c32", loads["submit"].requests_per_second, "req/s",
               loads["bare submit"].requests_per_second, "bare server", ">= 0.8"),
        Figure(f"polls, limiter on / off: GET /v3/operations/{{id}}, wrk -t1 -c32, best of {ROUNDS}", limited,
               "req/s", unlimited, "limiter off: admin-exempt tokens", ">= 0.95"),
    ]  # fmt: skip


async def figures(seconds: int) -> list[Figure]:
    """Start a system, prepare it, and measure (see the module's docstring)."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")
    async with running_system(workers=2, overrides=SETTINGS) as system:
        prepared = await prepare(system)
        conditional = await conditional_poll_requests(system, prepared)
        exempt = await exempt_poll_requests(system, prepared)
        return await asyncio.to_thread(measure, system, prepared, conditional, exempt, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    print_table(asyncio.run(figures(parser.parse_args().seconds)))


if __name__ == "__main__":
    main()
