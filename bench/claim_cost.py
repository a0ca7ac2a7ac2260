"""Benchmark: what a small export's claim and SUCCEEDED commit cost Postgres (docs/benchmark.md: The claim's own
steps). On a migrated database of its own, one connection claims and commits ``EXPORTS`` queued exports one
after the other through the worker's calls (``leases.claim_export``, ``leases.succeed_export``); the baseline
does the same with the bare worker's two statements (``bench.bare_pipeline.CLAIM`` and ``SUCCEED``) on the bare
pipeline's tables. The first ``WARM_UP`` of each are run, the tables analysed and a new connection opened, as a
running system's would have; then ``ROUNDS`` rounds of each, alternated, each round's server process CPU time
(from ``/proc``, so the server must run on this machine) and wall time per export. Prints the medians and the
ratios. Usage:

    .venv/bin/python bench/claim_cost.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bare_pipeline import CLAIM, SCHEMA, SUCCEED
from bench.proc import process_figures
from bench.running import PG_SERVER, admin_execute
from shared.migrator import migrate
from shared.repository import leases
from shared.repository.artifacts import ArtifactFiles
from shared.storage import ARTIFACT_KEY_SUFFIXES

WARM_UP = 500
EXPORTS = 1000
ROUNDS = 3
# A budget no run spends: a claim never parks.
MAX_ATTEMPTS = 1_000_000

Pair = Callable[[asyncpg.Connection, str], Awaitable[None]]


async def product_pair(conn: asyncpg.Connection, operation_id: str) -> None:
    """The worker's claim of ``operation_id`` and its SUCCEEDED commit of a file of one PutObject."""
    claim = await leases.claim_export(
        conn,
        operation_id=operation_id,
        worker_id="bench",
        lease_seconds=60,
        max_attempts=MAX_ATTEMPTS,
        message="lost",
        key_stem=f"exports/{operation_id}/g",
        key_suffixes=ARTIFACT_KEY_SUFFIXES,
    )
    claimed = claim.claimed
    assert claimed is not None and claim.member
    key = f"exports/{operation_id}/g{claimed.generation}.jsonl"
    files = ArtifactFiles.one_file(key, size_bytes=15_000, sha256="ab" * 32, message_count=100)
    outcome = await leases.succeed_export(
        conn, claimed=claimed, files=files, artifact_generation=claimed.generation, result_ttl_seconds=3600
    )
    assert outcome is leases.SucceedOutcome.SUCCEEDED


async def bare_pair(conn: asyncpg.Connection, operation_id: str) -> None:
    """The bare worker's claim and commit of ``operation_id``."""
    assert await conn.fetchval(CLAIM, operation_id) is not None
    await conn.execute(SUCCEED, operation_id)


@asynccontextmanager
async def database(schema: Callable[[str], Awaitable[object]], insert: str, count: int) -> AsyncIterator[str]:
    """A database of its own for the length of the block, made by ``schema(url)``, holding conversation ``c-a``
    with its member ``alice`` and ``count`` queued operations ``op000000``..., inserted by ``insert``.
    """
    name = f"chatexport_claims_{uuid.uuid4().hex[:8]}"
    url = f"{PG_SERVER}/{name}"
    await admin_execute(f'CREATE DATABASE "{name}"')
    try:
        await schema(url)
        conn = await asyncpg.connect(url)
        try:
            await conn.executemany(insert, [(f"op{n:06d}",) for n in range(count)])
            await conn.execute("VACUUM ANALYZE")
        finally:
            await conn.close()
        yield url
    finally:
        await admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def product_schema(url: str) -> None:
    await migrate(url)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("INSERT INTO conversations (conversation_id, last_seq) VALUES ('c-a', 100)")
        await conn.execute("INSERT INTO conversation_members (conversation_id, user_id) VALUES ('c-a', 'alice')")
    finally:
        await conn.close()


async def bare_schema(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(SCHEMA)
    finally:
        await conn.close()


class Loop:
    """One side of the comparison: its database, its pair of calls and the operations not yet claimed."""

    def __init__(self, url: str, pair: Pair, total: int) -> None:
        self._url = url
        self._pair = pair
        self._next = iter([f"op{n:06d}" for n in range(total)])
        self._conn: asyncpg.Connection | None = None

    async def warm_up(self) -> None:
        """Run ``WARM_UP`` pairs, analyse the tables they grew and open the connection the rounds use."""
        conn = await asyncpg.connect(self._url)
        try:
            for _ in range(WARM_UP):
                await self._pair(conn, next(self._next))
            await conn.execute("ANALYZE")
        finally:
            await conn.close()
        self._conn = await asyncpg.connect(self._url)

    async def round(self, exports: int) -> tuple[float, float]:
        """Claim and commit ``exports`` operations; the server process's CPU time and the wall time, in
        microseconds per export.
        """
        assert self._conn is not None
        server = self._conn.get_server_pid()
        cpu_before, started = process_figures(server)[1], time.perf_counter()
        for _ in range(exports):
            await self._pair(self._conn, next(self._next))
        cpu, wall = process_figures(server)[1] - cpu_before, time.perf_counter() - started
        return cpu / exports * 1e6, wall / exports * 1e6

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()


async def measure(rounds: int) -> None:
    total = WARM_UP + rounds * EXPORTS
    product_insert = (
        "INSERT INTO operations (operation_id, owner_id, conversation_id, format, state)"
        " VALUES ($1, 'alice', 'c-a', 'jsonl', 'QUEUED')"
    )
    bare_insert = "INSERT INTO operations (operation_id, owner_id, conversation_id) VALUES ($1, 'alice', 'c-a')"
    async with (
        database(product_schema, product_insert, total) as product_url,
        database(bare_schema, bare_insert, total) as bare_url,
    ):
        loops = {"product": Loop(product_url, product_pair, total), "bare": Loop(bare_url, bare_pair, total)}
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in loops}
        try:
            for loop in loops.values():
                await loop.warm_up()
            for _ in range(rounds):
                for name, loop in loops.items():
                    figures[name].append(await loop.round(EXPORTS))
        finally:
            for loop in loops.values():
                await loop.close()
    cpu = {name: statistics.median(cpu for cpu, _ in runs) for name, runs in figures.items()}
    wall = {name: statistics.median(wall for _, wall in runs) for name, runs in figures.items()}
    print(f"claim and SUCCEEDED commit, {rounds} rounds of {EXPORTS} exports each, medians:")
    print("| figure | product | bare | product / bare |")
    print("|---|---|---|---|")
    for figure, medians in (("Postgres CPU per export, us", cpu), ("wall time per export, us", wall)):
        product, bare = medians["product"], medians["bare"]
        print(f"| {figure} | {product:.0f} | {bare:.0f} | {product / bare:.2f} |")
    for name, runs in figures.items():
        print(f"{name} rounds (CPU, wall us): " + ", ".join(f"{c:.0f} {w:.0f}" for c, w in runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    asyncio.run(measure(parser.parse_args().rounds))


if __name__ == "__main__":
    main()
