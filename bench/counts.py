"""Benchmark: what one small export costs each part, counted on the client side (docs/benchmark.md:
Benchmark, Counts). Starts the bare pipeline, then the product, each with two workers as in ``bench/drain.py``,
with ``bench/counting`` leading every part's ``PYTHONPATH``. On each it runs a few exports to warm the
statement caches, takes every part's counts and CPU time, drains ``EXPORTS`` exports of 100 messages from
the drain's 16 clients, takes them again, and prints per export: each part's statements, round trips,
transactions, notifications received, broker messages published and deliveries acknowledged, the garbage
collector's milliseconds, and CPU milliseconds. The parts' polling loops count too, so the figures are per
export of a drain, not of an export alone. Usage:

    .venv/bin/python bench/counts.py [--exports N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bare_system import pipeline
from bench.drain import MESSAGES, SETTINGS, Clients, bare_clients, drain, prepare
from bench.proc import process_figures
from bench.running import running_system

EXPORTS = 300
# The product's parts, by the start of their names; moto, also a part of the system, counts nothing.
PARTS = ("api", "relay", "worker", "janitor")
WARM_UP = 20
COUNTING = Path(__file__).resolve().parent / "counting"
COLUMNS = (
    "statements",
    "round trips",
    "transactions",
    "notifications received",
    "broker messages published",
    "broker deliveries acknowledged",
    "collector ms",
)


async def snapshot(pids: dict[str, int], folder: Path) -> dict[str, Counter[str]]:
    """Every part's counts now, with its CPU milliseconds, by part name (``pids``: ``{name: pid}``); parts
    of one kind (two workers) are summed under the kind's name.
    """
    return await asyncio.to_thread(_collect, folder, pids)


def _collect(folder: Path, pids: dict[str, int]) -> dict[str, Counter[str]]:
    for pid in pids.values():
        (folder / f"{pid}.json").unlink(missing_ok=True)
        os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while not all((folder / f"{pid}.json").exists() for pid in pids.values()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no counts from {sorted(pids)} in 30 s")
        time.sleep(0.05)
    counts: dict[str, Counter[str]] = {}
    for name, pid in pids.items():
        part = Counter(json.loads((folder / f"{pid}.json").read_text()))
        part["CPU ms"] = round(process_figures(pid)[1] * 1000)
        counts.setdefault(name.rstrip("-0123456789"), Counter()).update(part)
    return counts


def print_per_export(before: dict[str, Counter[str]], after: dict[str, Counter[str]], exports: int) -> None:
    """A Markdown table of each part's counts per export between the two snapshots."""
    columns = (*COLUMNS, "CPU ms")
    print("| part | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for part in sorted(after):
        spent = after[part] - before.get(part, Counter())
        print(f"| {part} | " + " | ".join(f"{spent[column] / exports:.2f}" for column in columns) + " |")


async def counted_drain(
    base_url: str, database_url: str, clients: Clients, pids: dict[str, int], folder: Path, exports: int
) -> None:
    """Warm the pipeline at ``base_url`` up, drain ``exports`` exports through it and print what each of its
    parts (``pids``) counted per export.
    """
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        async with aiohttp.ClientSession(base_url=base_url) as api:
            await drain(api, pool, clients, WARM_UP)
            before = await snapshot(pids, folder)
            rate = await drain(api, pool, clients, exports)
            after = await snapshot(pids, folder)
    finally:
        await pool.close()
    print(f"per export of a drain of {exports} exports of {MESSAGES} messages ({rate:.0f} operations/s):")
    print_per_export(before, after, exports)


async def measure(exports: int) -> None:
    """Count on the bare pipeline, then on the product."""
    folder = Path(tempfile.mkdtemp())
    path = os.pathsep.join([str(COUNTING), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    counting = {"PYTHONPATH": path, "BENCH_COUNTS_DIR": str(folder)}
    print("bare pipeline:")
    async with pipeline(workers=2, conversations={cid: MESSAGES for _, cid in bare_clients()}, env=counting) as bare:
        await counted_drain(bare.base_url, bare.database_url, bare_clients(), bare.group.pids(), folder, exports)
    print("product:")
    async with running_system(workers=2, overrides={**SETTINGS, **counting}) as system:
        async with aiohttp.ClientSession(base_url=system.base_url) as api:
            clients = await prepare(api, system)
        pids = {name: pid for name, pid in system.group.pids().items() if name.startswith(PARTS)}
        await counted_drain(system.base_url, system.settings().database_url, clients, pids, folder, exports)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exports", type=int, default=EXPORTS)
    asyncio.run(measure(parser.parse_args().exports))


if __name__ == "__main__":
    main()
