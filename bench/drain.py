"""Benchmark: how fast small exports go through the whole system, and how long one takes when nothing else
runs, each beside a bare pipeline doing the same steps with the least code (``bench/bare_pipeline.py``)
driven by the same client in the same run (docs/benchmark.md: Benchmark, Bare pipeline).

Starts the bare pipeline and the product from the compose file side by side (two workers each, ``make run``'s
other settings), each on a fresh database with ``CLIENTS`` users each a member of a conversation of 100
messages, then measures them in turn, ``ROUNDS`` rounds with the order swapped each round, so that a change
of the machine's speed during the run falls on both in turn. Before each measurement both databases are
vacuumed and Postgres checkpoints, so that no measurement cleans up after an earlier one. Each measurement
takes:

- the latency of one export of 100 messages submitted alone, one after the other: from its creation to its
  SUCCEEDED commit, both by the database's clock (the samples are split between the rounds);
- the drain: ``--exports`` exports submitted by ``CLIENTS`` concurrent clients (the quota raised so none is
  refused), from the first submit's creation to the last SUCCEEDED;
- the CPU time per export of the drain of each group of processes: its own (api, relay, workers), its moto,
  and all of Postgres' and RabbitMQ's, from ``/proc`` (the idle pipeline's few polls of the servers count
  in the measured one's).

Each round's ratios are printed as it ends; the figures pool the rounds: exports over seconds for the drain,
CPU time over exports, the p50 and p99 of every sample. Usage:

    .venv/bin/python bench/drain.py [--exports N] [--samples N] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bare_system import pipeline
from bench.proc import cpu_spent, cpu_times, pids_of
from bench.running import admin_execute, admin_headers, execute_on, member_conversation, running_system
from bench.table import Figure, percentile, print_table
from devtools.localsystem import LocalSystem
from shared.auth import mint_token

CLIENTS = 16
ROUNDS = 3
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
    # extract() gives a numeric, which asyncpg decodes as a Decimal.
    seconds = float(
        await pool.fetchval(
            "SELECT extract(epoch FROM max(finished_at) - min(created_at)) FROM operations"
            " WHERE operation_id = ANY($1)",
            operation_ids,
        )
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
        milliseconds = await pool.fetchval(
            "SELECT extract(epoch FROM finished_at - created_at) * 1000 FROM operations WHERE operation_id = $1",
            operation_id,
        )
        found.append(float(milliseconds))
    return found


# Where the CPU time of a drain goes besides the pipeline's own processes: the servers both share.
SERVERS = {"Postgres": "postgres", "RabbitMQ": "beam.smp"}


@dataclass(frozen=True)
class Run:
    """What one measurement of a pipeline found: its drain's seconds, the CPU time per export of the drain (ms)
    by group of processes (``own``: its api, relay and workers; then moto, Postgres and RabbitMQ), and the
    latencies of exports alone (ms).
    """

    seconds: float
    cpu_ms: dict[str, float]
    alone: list[float]


async def measure(side: Pipeline, exports: int, samples: int) -> Run:
    """Latencies of ``samples`` exports alone, then a drain of ``exports``, on ``side``."""
    groups = {**side.groups, **{name: pids_of(command) for name, command in SERVERS.items()}}
    pool = await asyncpg.create_pool(side.database_url, min_size=1, max_size=2)
    try:
        async with aiohttp.ClientSession(base_url=side.base_url) as api:
            alone = await latencies(api, pool, *side.clients[0], samples)
            before = {name: cpu_times(pids) for name, pids in groups.items()}
            rate = await drain(api, pool, side.clients, exports)
            after = {name: cpu_times(pids) for name, pids in groups.items()}
    finally:
        await pool.close()
    spent = {name: cpu_spent(before[name], after[name]) * 1000 / exports for name in groups}
    return Run(exports / rate, spent, alone)


async def cleaned_up(*sides: Pipeline) -> None:
    """Vacuum every one of ``sides``' databases, then checkpoint: what the rounds before left to clean up is
    done before the next measurement starts, not during it.
    """
    for side in sides:
        await execute_on(side.database_url, "VACUUM")
    # Server-wide: both pipelines' databases are on the benchmark server.
    await admin_execute("CHECKPOINT")


@dataclass(frozen=True)
class Pipeline:
    """A pipeline being measured: where its api answers, its database, its clients, and its processes' pids
    by group (``own``: its api, relay and workers; ``moto``).
    """

    base_url: str
    database_url: str
    clients: Clients
    groups: dict[str, list[int]]


def bare_clients() -> Clients:
    """The bare pipeline's clients: ``prepare``'s conversations, with a user's name for a token."""
    return [({"Authorization": f"Bearer drain-{n}"}, f"drain-c{n}") for n in range(CLIENTS)]


@contextlib.asynccontextmanager
async def bare_pipeline() -> AsyncIterator[Pipeline]:
    """The bare pipeline with two workers."""
    clients = bare_clients()
    async with pipeline(workers=2, conversations={cid: MESSAGES for _, cid in clients}) as bare:
        groups = {"own": list(bare.group.pids().values()), "moto": [bare.moto.process.pid]}
        yield Pipeline(bare.base_url, bare.database_url, clients, groups)


@contextlib.asynccontextmanager
async def product_pipeline() -> AsyncIterator[Pipeline]:
    """The product with two workers."""
    async with running_system(workers=2, overrides=SETTINGS) as system:
        async with aiohttp.ClientSession(base_url=system.base_url) as api:
            clients = await prepare(api, system)
        pids = system.group.pids()
        groups = {"own": [pid for name, pid in pids.items() if name.startswith(OWN_PARTS)], "moto": [pids["moto"]]}
        yield Pipeline(system.base_url, system.settings().database_url, clients, groups)


@dataclass
class Pooled:
    """The runs of one pipeline so far: seconds and exports of its drains, CPU milliseconds by group, and
    every lone export's latency (ms).
    """

    seconds: float = 0.0
    exports: int = 0
    cpu_ms: Counter[str] = field(default_factory=Counter)
    alone: list[float] = field(default_factory=list)

    def add(self, run: Run, exports: int) -> None:
        """Count in ``run``, a measurement with a drain of ``exports``."""
        self.seconds += run.seconds
        self.exports += exports
        self.cpu_ms.update({name: ms * exports for name, ms in run.cpu_ms.items()})
        self.alone.extend(run.alone)

    @property
    def rate(self) -> float:
        """Operations per second over every drain."""
        return self.exports / self.seconds

    def cpu_per_export(self, group: str) -> float:
        """CPU milliseconds per export of ``group``'s processes over every drain."""
        return self.cpu_ms[group] / self.exports


async def figures(exports: int, samples: int, rounds: int = ROUNDS) -> list[Figure]:
    """Measure both pipelines ``rounds`` times in turn (see the module's docstring); ``samples`` lone exports
    are shared between the rounds, at least one each.
    """
    if not 0 < rounds <= samples:
        raise ValueError(f"{rounds} rounds need 1 to {samples} of the {samples} lone exports each")
    bare, product = Pooled(), Pooled()
    async with bare_pipeline() as bare_side, product_pipeline() as product_side:
        for number in range(rounds):
            share = samples // rounds + (1 if number < samples % rounds else 0)
            turns = [("bare", bare, bare_side), ("product", product, product_side)]
            runs = {}
            for name, pooled, side in turns if number % 2 == 0 else reversed(turns):
                await cleaned_up(bare_side, product_side)
                runs[name] = run = await measure(side, exports, share)
                pooled.add(run, exports)
            ours, theirs = runs["product"], runs["bare"]
            print(
                f"round {number + 1}: drain {theirs.seconds / ours.seconds:.2f},"
                f" CPU per export {ours.cpu_ms['own'] / theirs.cpu_ms['own']:.2f},"
                f" p50 alone {percentile(ours.alone, 0.5) / percentile(theirs.alone, 0.5):.2f}",
                flush=True,
            )
    bare_named = {"baseline_name": "bare pipeline"}
    return [
        Figure(f"drain: {exports} exports of {MESSAGES} messages, {CLIENTS} clients, 2 workers, {rounds} rounds",
               product.rate, "operations/s", baseline=bare.rate, target="ratio >= 0.8", **bare_named),
        Figure("CPU per export of the drain: api, relay, workers", product.cpu_per_export("own"), "ms",
               baseline=bare.cpu_per_export("own"), target="ratio <= 1.35", **bare_named),
        *(Figure(f"CPU per export of the drain: {name}", product.cpu_per_export(name), "ms",
                 baseline=bare.cpu_per_export(name), **bare_named) for name in ("moto", *SERVERS)),
        Figure(f"202 -> SUCCEEDED, {MESSAGES} messages, alone: p50", percentile(product.alone, 0.5), "ms",
               baseline=percentile(bare.alone, 0.5), target="ratio <= 1.15", **bare_named),
        Figure(f"202 -> SUCCEEDED, {MESSAGES} messages, alone: p99", percentile(product.alone, 0.99), "ms",
               baseline=percentile(bare.alone, 0.99), target="hold", **bare_named),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exports", type=int, default=1500)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    print_table(asyncio.run(figures(args.exports, args.samples, args.rounds)))


if __name__ == "__main__":
    main()
