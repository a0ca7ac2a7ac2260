"""Benchmark: waiters by the ten thousand on one api process (docs/benchmark.md: Benchmark, Waiters). This
process is the load generator; the api is the system's own, its wait caps raised, every other part paused
so that nothing but the benchmark changes an operation:

- ``LONG_POLLS`` long polls (``wait=60``) and ``STREAMS`` event streams, spread over ``OPERATIONS``
  operations of one user: the api's resident memory per waiter (against the api before them), and its CPU
  while nothing changes;
- then ``CHANGES`` operations change state one after the other: the time from each UPDATE's commit to the
  last answer of its waiters (a long poll's 200, a stream's event), p50 and p99 over the changes;
- separately, ``ONE_OPERATION`` long polls on a single operation, and the same time for its change.

Usage:

    .venv/bin/python bench/waiters.py [--long-polls N] [--streams N]
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path

import aiohttp
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.proc import process_figures
from bench.running import running_system
from bench.table import Figure, percentile, print_table
from devtools.localsystem import LocalSystem
from shared.auth import mint_token

LONG_POLLS = 10_000
STREAMS = 2_000
OPERATIONS = 100
CHANGES = 20
ONE_OPERATION = 1_000
CONNECTING_AT_ONCE = 200
IDLE_SECONDS = 10
CAPS = {"CHATEXPORT_WAIT_CONCURRENCY": "20000", "CHATEXPORT_WAIT_PER_USER_CONCURRENCY": "20000"}
USER = "bench-waiter"


class Waiters:
    """The load generator's waiting requests and when each got its answer (wall clock, seconds)."""

    def __init__(self, api: aiohttp.ClientSession, token: str) -> None:
        self._api = api
        self._headers = {"Authorization": f"Bearer {token}"}
        self.answered: defaultdict[str, list[float]] = defaultdict(list)
        self._expected: dict[str, tuple[int, asyncio.Event]] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def long_poll(self, operation_id: str) -> None:
        self.tasks.append(asyncio.create_task(self._long_poll(operation_id)))

    def stream(self, operation_id: str) -> None:
        self.tasks.append(asyncio.create_task(self._stream(operation_id)))

    def expect(self, operation_id: str, count: int) -> asyncio.Event:
        """An event set once ``count`` waiters of ``operation_id`` have their answer."""
        event = asyncio.Event()
        self._expected[operation_id] = (count, event)
        return event

    def _answer(self, operation_id: str) -> None:
        self.answered[operation_id].append(time.time())
        count, event = self._expected.get(operation_id, (0, None))
        if event is not None and len(self.answered[operation_id]) >= count:
            event.set()

    async def _long_poll(self, operation_id: str) -> None:
        async with self._api.get(f"/v3/operations/{operation_id}?wait=60", headers=self._headers) as response:
            await response.read()
        self._answer(operation_id)

    async def _stream(self, operation_id: str) -> None:
        async with self._api.get(f"/v3/operations/{operation_id}/events", headers=self._headers) as response:
            await response.content.readuntil(b"\n\n")  # the representation on connect
            await response.content.readuntil(b"\n\n")
        self._answer(operation_id)


async def operations(conn: asyncpg.Connection, prefix: str, count: int) -> list[str]:
    """``count`` QUEUED operations of ``USER``, written directly (no wake-up: nothing runs them)."""
    ids = [f"op_{prefix}{n:06d}" for n in range(count)]
    await conn.executemany(
        "INSERT INTO operations (operation_id, owner_id, conversation_id, format, state)"
        " VALUES ($1, $2, 'bench-conversation', 'jsonl', 'QUEUED')",
        [(operation_id, USER) for operation_id in ids],
    )
    return ids


async def change_latency(conn: asyncpg.Connection, waiters: Waiters, operation_id: str, expected: int) -> float:
    """Move ``operation_id`` to RUNNING; seconds from the commit to the last of its ``expected`` answers."""
    all_answered = waiters.expect(operation_id, expected)
    committed = time.time()
    await conn.execute("UPDATE operations SET state = 'RUNNING' WHERE operation_id = $1", operation_id)
    await asyncio.wait_for(all_answered.wait(), 60)
    return max(waiters.answered[operation_id]) - committed


async def until_waiting(api: aiohttp.ClientSession, metrics_url: str, done: Callable[[float], bool]) -> None:
    """Return once ``done`` holds for the waiting requests the api counts (its ``/metrics``); fail after two
    minutes.
    """
    async with asyncio.timeout(120):
        while True:
            async with api.get(metrics_url) as response:
                text = await response.text()
            lines = [line for line in text.splitlines() if line.startswith("chatexport_api_waiting_requests{")]
            if done(sum(float(line.rsplit(" ", 1)[1]) for line in lines)):
                return
            await asyncio.sleep(0.2)


async def open_waiters(
    api: aiohttp.ClientSession, metrics_url: str, starts: list[Callable[[], None]], already: int = 0
) -> None:
    """Call each of ``starts`` (each opens one waiting request), in steps each waited for, so that the api's
    listen backlog never overflows; ``already`` waiting before them.
    """
    for first in range(0, len(starts), CONNECTING_AT_ONCE):
        step = starts[first : first + CONNECTING_AT_ONCE]
        for start in step:
            start()
        await until_waiting(api, metrics_url, partial(operator.le, already + first + len(step)))


async def measure(system: LocalSystem, long_polls: int, streams: int) -> list[Figure]:
    settings = system.settings()
    pid = system.group.pids()["api"]
    token = mint_token(settings, user_id=USER, ttl_seconds=3600)
    connector = aiohttp.TCPConnector(limit=0)
    conn = await asyncpg.connect(settings.database_url)
    try:
        async with aiohttp.ClientSession(base_url=system.base_url, connector=connector) as api:
            spread = await operations(conn, "spread", OPERATIONS)
            single = await operations(conn, "single", 1)
            waiters = Waiters(api, token)
            idle_rss, _ = process_figures(pid)
            metrics_url = f"http://127.0.0.1:{system.metrics_ports['api']}/metrics"
            kinds = [waiters.long_poll] * long_polls + [waiters.stream] * streams
            opened = time.perf_counter()
            await open_waiters(
                api, metrics_url, [partial(kind, spread[n % OPERATIONS]) for n, kind in enumerate(kinds)]
            )
            opened = time.perf_counter() - opened
            rss, cpu = process_figures(pid)
            await asyncio.sleep(IDLE_SECONDS)  # the measurement itself: CPU over a stretch where nothing changes
            idle_cpu = (process_figures(pid)[1] - cpu) / IDLE_SECONDS
            per_operation = (long_polls + streams) // OPERATIONS
            before_changes = process_figures(pid)[1]
            latencies = [await change_latency(conn, waiters, spread[n], per_operation) for n in range(CHANGES)]
            # The api's CPU for each answer: a long poll's 200 or a stream's event, with the reads they share.
            per_answer_ms = (process_figures(pid)[1] - before_changes) * 1000 / (CHANGES * per_operation)
            # The first waiters go (their long polls would reach their deadline meanwhile).
            for task in waiters.tasks:
                task.cancel()
            await until_waiting(api, metrics_url, lambda count: count == 0)
            await open_waiters(api, metrics_url, [partial(waiters.long_poll, single[0])] * ONE_OPERATION)
            one = await change_latency(conn, waiters, single[0], ONE_OPERATION)
            for task in waiters.tasks:
                task.cancel()
            await asyncio.gather(*waiters.tasks, return_exceptions=True)
    finally:
        await conn.close()
    per_waiter_kb = (rss - idle_rss) * 1024 / (long_polls + streams)
    print(
        f"waiters: {long_polls + streams:,} on {OPERATIONS} operations, opened in {opened:.0f} s; "
        f"api RSS {idle_rss:.0f} -> {rss:.0f} MB "
        f"({per_waiter_kb:.1f} KB a waiter); CPU while nothing changes {idle_cpu * 100:.1f}% of a core; "
        f"change -> last answer p50 {percentile(latencies, 0.5) * 1000:.0f} ms, "
        f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms, api CPU {per_answer_ms:.3f} ms an answer; "
        f"{ONE_OPERATION:,} on one operation {one * 1000:.0f} ms"
    )
    return [
        Figure(f"api RSS with {long_polls:,} long polls and {streams:,} streams", rss, "MB", idle_rss,
               "the api before them", f"{per_waiter_kb:.1f} KB a waiter"),
        Figure("api CPU while they wait and nothing changes", idle_cpu * 100, "% of a core", target="reported"),
        Figure(f"change -> last of its {per_operation} waiters' answers, p50", percentile(latencies, 0.5) * 1000,
               "ms", target="reported"),
        Figure(f"change -> last of its {per_operation} waiters' answers, p99", percentile(latencies, 0.99) * 1000,
               "ms", target="<= 100 ms"),
        Figure("api CPU per answer to a change (a long poll's 200, a stream's event)", per_answer_ms, "ms",
               target="reported"),
        Figure(f"change -> last of {ONE_OPERATION:,} long polls on one operation", one * 1000, "ms",
               target="reported"),
    ]  # fmt: skip


async def figures(long_polls: int = LONG_POLLS, streams: int = STREAMS) -> list[Figure]:
    """Start a system with the caps raised, pause all but its api, and measure."""
    async with running_system(workers=1, overrides=CAPS) as system:
        others = [name for name in system.group.pids() if name != "api"]
        with system.group.paused(others):
            return await measure(system, long_polls, streams)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long-polls", type=int, default=LONG_POLLS)
    parser.add_argument("--streams", type=int, default=STREAMS)
    args = parser.parse_args()
    print_table(asyncio.run(figures(args.long_polls, args.streams)))


if __name__ == "__main__":
    main()
