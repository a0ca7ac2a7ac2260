"""Benchmark: how promptly the system settles work nobody holds, through the running system.

Starts its own system from the compose file (moto server, api, relay, two workers, a janitor as processes)
on a fresh database and prints, with the bounds the README gives:

- cancel latency (p50, p99, max) from the cancel's ``202`` to CANCELED, for exports still QUEUED (their
  wake-up lost, so nothing but the cancel's own wake-up can end them) and for exports RUNNING;
- the time from a SIGKILL of the worker holding an export to the takeover by another (generation 2),
  against the lease plus one janitor interval.

Leases of 5 s and a janitor pass every 2 s keep the run short; the figures scale with both. Usage:

    .venv/bin/python bench/recovery.py [--samples N] [--messages N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.running import running_system
from devtools.localsystem import LocalSystem
from shared.auth import mint_token

LEASE_SECONDS = 5.0
JANITOR_INTERVAL_SECONDS = 2.0
SETTINGS = {
    "CHATEXPORT_LEASE_SECONDS": str(LEASE_SECONDS),
    "CHATEXPORT_HEARTBEAT_SECONDS": "1",
    "CHATEXPORT_JANITOR_INTERVAL_SECONDS": str(JANITOR_INTERVAL_SECONDS),
    "CHATEXPORT_MAX_ACTIVE_EXPORTS": "10000",
}
POLL_SECONDS = 0.005
WAIT_SECONDS = 120.0


class Bench:
    """The running system with an admin and a user session."""

    def __init__(self, system: LocalSystem, http: aiohttp.ClientSession, pool: asyncpg.Pool) -> None:
        self.system, self.http, self.pool = system, http, pool
        settings = system.settings()
        self.admin = {"Authorization": f"Bearer {mint_token(settings, user_id='root', scopes=['admin'])}"}
        self.user = {"Authorization": f"Bearer {mint_token(settings, user_id='alice')}"}

    async def conversation(self, cid: str, messages: int, body_bytes: int) -> None:
        async with self.http.put(f"/admin/conversations/{cid}", json={"members": ["alice"]}, headers=self.admin) as r:
            assert r.status < 300, await r.text()
        headers = {**self.admin, "Content-Type": "application/x-ndjson"}
        for start in range(0, messages, 10_000):
            lines = [
                json.dumps({"message_id": f"m{n}", "sender_id": "alice", "body": "x" * body_bytes})
                for n in range(start, min(start + 10_000, messages))
            ]
            body = ("\n".join(lines) + "\n").encode()
            async with self.http.post(f"/admin/conversations/{cid}/messages:import", data=body, headers=headers) as r:
                assert r.status == 200, await r.text()

    async def submit(self, cid: str) -> str:
        headers = {**self.user, "Idempotency-Key": uuid.uuid4().hex}
        async with self.http.post(f"/v3/conversations/{cid}/exports", json={"format": "jsonl"}, headers=headers) as r:
            assert r.status == 202, await r.text()
            operation_id: str = (await r.json())["operation_id"]
            return operation_id

    async def cancel(self, operation_id: str) -> float:
        """Seconds from the cancel's answer to CANCELED."""
        async with self.http.post(f"/v3/operations/{operation_id}/cancel", headers=self.user) as r:
            assert r.status == 202, await r.text()
        accepted = time.perf_counter()
        await self.wait(operation_id, "state = 'CANCELED'")
        return time.perf_counter() - accepted

    async def wait(self, operation_id: str, condition: str) -> None:
        """Poll the operation's row until ``condition`` (SQL) holds; at most ``WAIT_SECONDS``."""
        query = f"SELECT {condition} FROM operations WHERE operation_id = $1"
        async with asyncio.timeout(WAIT_SECONDS):
            while not await self.pool.fetchval(query, operation_id):  # noqa: ASYNC110 - Postgres is what is timed
                await asyncio.sleep(POLL_SECONDS)


async def queued_cancels(bench: Bench, samples: int) -> list[float]:
    """Exports held in QUEUED: submitted while the relay is stopped, their wake-ups then dropped."""
    await bench.conversation("c-small", 20, 20)
    bench.system.group.send("relay", signal.SIGSTOP)
    try:
        operations = [await bench.submit("c-small") for _ in range(samples)]
        await bench.pool.execute("DELETE FROM outbox WHERE published_at IS NULL")
    finally:
        bench.system.group.send("relay", signal.SIGCONT)
    return [await bench.cancel(operation_id) for operation_id in operations]


async def running_cancels(bench: Bench, samples: int) -> list[float]:
    latencies = []
    for _ in range(samples):
        operation_id = await bench.submit("c-big")
        await bench.wait(operation_id, "state = 'RUNNING' AND progress_phase = 'writing'")
        latencies.append(await bench.cancel(operation_id))
    return latencies


async def takeover(bench: Bench) -> float:
    """Seconds from a SIGKILL of the holder to generation 2's claim."""
    operation_id = await bench.submit("c-big")
    await bench.wait(operation_id, "state = 'RUNNING' AND progress_phase = 'writing'")
    owner = await bench.pool.fetchval("SELECT lease_owner FROM operations WHERE operation_id = $1", operation_id)
    bench.system.group.kill(bench.system.holder(owner))
    killed = time.perf_counter()
    await bench.wait(operation_id, "generation >= 2 AND state = 'RUNNING'")
    return time.perf_counter() - killed


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def show(name: str, values: list[float]) -> None:
    ms = [value * 1000 for value in values]
    print(
        f"{name:<34}{statistics.median(ms):>8.0f} ms p50 {percentile(ms, 0.99):>8.0f} ms p99"
        f" {max(ms):>8.0f} ms max  (n={len(ms)})"
    )


async def run(samples: int, messages: int) -> None:
    async with (
        running_system(workers=2, overrides=SETTINGS) as system,
        aiohttp.ClientSession(base_url=system.base_url) as http,
        asyncpg.create_pool(system.settings().database_url, min_size=1, max_size=2) as pool,
    ):
        bench = Bench(system, http, pool)
        queued = await queued_cancels(bench, samples)
        await bench.conversation("c-big", messages, 300)
        running = await running_cancels(bench, samples)
        taken_over = await takeover(bench)
    show("cancel while QUEUED -> CANCELED", queued)
    show("cancel while RUNNING -> CANCELED", running)
    bound = LEASE_SECONDS + JANITOR_INTERVAL_SECONDS
    print(f"{'SIGKILL of the holder -> takeover':<34}{taken_over:>8.1f} s    (lease + janitor interval: {bound:.1f} s)")


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--messages", type=int, default=300_000)
    args = parser.parse_args(argv)
    asyncio.run(run(args.samples, args.messages))


if __name__ == "__main__":
    main()
