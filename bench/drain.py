"""Benchmark: how fast small exports go through the whole system, and how long one takes when nothing else
runs, each beside a bare pipeline doing the same steps with the least code (``bench/bare_pipeline.py``)
driven by the same client in the same run (docs/benchmark.md: Benchmark, Bare pipeline).

Starts the bare pipeline, then the product from the compose file (two workers each, ``make run``'s other
settings), each on a fresh database with ``CLIENTS`` users each a member of a conversation of 100 messages,
and measures on each:

- the latency of one export of 100 messages submitted alone, one after the other: from its creation to its
  SUCCEEDED commit, both by the database's clock, p50 and p99;
- the drain: ``EXPORTS`` exports submitted by ``CLIENTS`` concurrent clients (the quota raised so none is
  refused), from the first submit's creation to the last SUCCEEDED, in operations per second;
- the CPU time per export of the drain of its own processes (api, relay, workers), from ``/proc``.

Usage:

    .venv/bin/python bench/drain.py [--exports N] [--samples N]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bare_system import pipeline
from bench.proc import cpu_spent, cpu_times, pids_of
from bench.running import admin_headers, member_conversation, running_system
from bench.table import Figure, percentile, print_table
from devtools.localsystem import LocalSystem
from shared.auth import mint_token

CLIENTS = 16
MESSAGES = 100
# The processes whose CPU time counts: the product's own, not moto's or the janitor's.
OWN_PARTS = ("api", "relay", "worker")
SETTINGS = {"CHATEXPORT_MAX_ACTIVE_EXPORTS": "1000000"}
WAIT_SECONDS = 600.0

# Every client's (headers, conversation).
Clients = list[tuple[dict[str, str], str]]


async def prepare(api: aiohttp.ClientSession, system: LocalSystem) -> Clients:
    """Every client's (headers, conversation)."""
    settings = system.settings()
    admin = admin_headers(system)
    clients = []
    for number in range(CLIENTS):
        user, cid = f"drain-{number}", f"drain-c{number}"
        await member_conversation(api, admin, user=user, cid=cid, messages=MESSAGES, body="message of the drain")
        clients.append(({"Authorization": f"Bearer {mint_token(settings, user_id=user)}"}, cid))
    return clients


async def submit(api: aiohttp.ClientSession, headers: dict[str, str], cid: str) -> str:
    async with api.post(
        f"/v3/conversations/{cid}/exports", json={}, headers={**headers, "Idempotency-Key": uuid.uuid4().hex}
    ) as r:
        assert r.status == 202, await r.text()
        operation_id: str = (await r.json())["operation_id"]
        return operation_id


async def all_succeeded(pool: asyncpg.Pool, operation_ids: list[str]) -> None:
    """Wait until every one of ``operation_ids`` SUCCEEDED (at most ``WAIT_SECONDS``); any other end fails."""
    async with asyncio.timeout(WAIT_SECONDS):
        while True:
            states = dict(
                await pool.fetch(
                    "SELECT state, count(*) FROM operations WHERE operation_id = ANY($1) GROUP BY state", operation_ids
                )
            )
            assert not set(states) - {"QUEUED", "RUNNING", "SUCCEEDED"}, states
            if states.get("SUCCEEDED") == len(operation_ids):
                return
            await asyncio.sleep(0.05)


async def drain(
    api: aiohttp.ClientSession, pool: asyncpg.Pool, clients: list[tuple[dict[str, str], str]], total: int
) -> float:
    """Operations per second from the first creation to the last SUCCEEDED."""

    async def client(headers: dict[str, str], cid: str, count: int) -> list[str]:
        return [await submit(api, headers, cid) for _ in range(count)]

    shares = [total // CLIENTS + (1 if n < total % CLIENTS else 0) for n in range(CLIENTS)]
    batches = await asyncio.gather(*(client(h, cid, share) for (h, cid), share in zip(clients, shares, strict=True)))
    operation_ids = [operation_id for batch in batches for operation_id in batch]
    await all_succeeded(pool, operation_ids)
    seconds: float = await pool.fetchval(
        "SELECT extract(epoch FROM max(finished_at) - min(created_at)) FROM operations WHERE operation_id = ANY($1)",
        operation_ids,
    )
    return len(operation_ids) / seconds


async def latencies(
    api: aiohttp.ClientSession, pool: asyncpg.Pool, headers: dict[str, str], cid: str, samples: int
) -> list[float]:
    """Milliseconds from creation to SUCCEEDED of ``samples`` exports run one at a time."""
    found = []
    for _ in range(samples):
        operation_id = await submit(api, headers, cid)
        await all_succeeded(pool, [operation_id])
        found.append(
            await pool.fetchval(
                "SELECT extract(epoch FROM finished_at - created_at) * 1000 FROM operations WHERE operation_id = $1",
                operation_id,
            )
        )
    return found


# Where the CPU time of a drain goes besides the pipeline's own processes: the servers both share.
SERVERS = {"Postgres": "postgres", "RabbitMQ": "beam.smp"}


@dataclass(frozen=True)
class Run:
    """What one pipeline did: its drain (operations/s), the CPU time per export of the drain (ms) by group of
    processes (``own``: its api, relay and workers; then moto, Postgres and RabbitMQ), and the latencies of
    exports alone (ms).
    """

    rate: float
    cpu_ms: dict[str, float]
    alone: list[float]


async def measure(
    base_url: str, database_url: str, clients: Clients, groups: dict[str, list[int]], exports: int, samples: int
) -> Run:
    """Latencies of ``samples`` exports alone, then a drain of ``exports``, on the pipeline at ``base_url``
    whose database is ``database_url``; ``groups`` names its own processes' pids (``own``) and its moto's.
    """
    groups = {**groups, **{name: pids_of(command) for name, command in SERVERS.items()}}
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        async with aiohttp.ClientSession(base_url=base_url) as api:
            alone = await latencies(api, pool, *clients[0], samples)
            before = {name: cpu_times(pids) for name, pids in groups.items()}
            rate = await drain(api, pool, clients, exports)
            after = {name: cpu_times(pids) for name, pids in groups.items()}
    finally:
        await pool.close()
    spent = {name: cpu_spent(before[name], after[name]) * 1000 / exports for name in groups}
    return Run(rate, spent, alone)


def bare_clients() -> Clients:
    """The bare pipeline's clients: ``prepare``'s conversations, with a user's name for a token."""
    return [({"Authorization": f"Bearer drain-{n}"}, f"drain-c{n}") for n in range(CLIENTS)]


async def bare_run(exports: int, samples: int) -> Run:
    """``measure`` on a bare pipeline of two workers."""
    clients = bare_clients()
    async with pipeline(workers=2, conversations={cid: MESSAGES for _, cid in clients}) as bare:
        groups = {"own": list(bare.group.pids().values()), "moto": [bare.moto.process.pid]}
        return await measure(bare.base_url, bare.database_url, clients, groups, exports, samples)


async def product_run(exports: int, samples: int) -> Run:
    """``measure`` on the product with two workers."""
    async with running_system(workers=2, overrides=SETTINGS) as system:
        async with aiohttp.ClientSession(base_url=system.base_url) as api:
            clients = await prepare(api, system)
        pids = system.group.pids()
        groups = {"own": [pid for name, pid in pids.items() if name.startswith(OWN_PARTS)], "moto": [pids["moto"]]}
        return await measure(system.base_url, system.settings().database_url, clients, groups, exports, samples)


async def figures(exports: int, samples: int) -> list[Figure]:
    """Measure the bare pipeline, then the product (see the module's docstring)."""
    bare = await bare_run(exports, samples)
    product = await product_run(exports, samples)
    bare_named = {"baseline_name": "bare pipeline"}
    return [
        Figure(f"drain: {exports} exports of {MESSAGES} messages, {CLIENTS} clients, 2 workers", product.rate,
               "operations/s", baseline=bare.rate, target="ratio >= 0.8", **bare_named),
        Figure("CPU per export of the drain: api, relay, workers", product.cpu_ms["own"], "ms",
               baseline=bare.cpu_ms["own"], target="ratio <= 1.35", **bare_named),
        *(Figure(f"CPU per export of the drain: {name}", product.cpu_ms[name], "ms", baseline=bare.cpu_ms[name],
                 **bare_named) for name in ("moto", *SERVERS)),
        Figure(f"202 -> SUCCEEDED, {MESSAGES} messages, alone: p50", percentile(product.alone, 0.5), "ms",
               baseline=percentile(bare.alone, 0.5), target="ratio <= 1.15", **bare_named),
        Figure(f"202 -> SUCCEEDED, {MESSAGES} messages, alone: p99", percentile(product.alone, 0.99), "ms",
               baseline=percentile(bare.alone, 0.99), target="hold", **bare_named),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exports", type=int, default=1500)
    parser.add_argument("--samples", type=int, default=100)
    args = parser.parse_args()
    print_table(asyncio.run(figures(args.exports, args.samples)))


if __name__ == "__main__":
    main()
