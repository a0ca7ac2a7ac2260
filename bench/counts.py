"""Benchmark: what one small export costs each part, counted on the client side (docs/benchmark.md:
Benchmark, Counts). Starts a system like ``bench/drain.py``'s (two workers) with ``bench/counting`` leading
every part's ``PYTHONPATH``, runs a few exports to warm the statement caches, takes every part's counts and
CPU time, drains ``EXPORTS`` exports of 100 messages from the drain's 16 clients, takes them again, and prints
per export: each part's statements, round trips, transactions, notifications received, broker messages
published and deliveries acknowledged, and CPU milliseconds. The parts' polling loops count too, so the
figures are per export of a drain, not of an export alone. Usage:

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

from bench.drain import SETTINGS, drain, prepare
from bench.running import running_system
from bench.waiters import api_figures
from devtools.localsystem import LocalSystem

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
)


async def snapshot(system: LocalSystem, folder: Path) -> dict[str, Counter[str]]:
    """Every part's counts now, with its CPU milliseconds, by part name; parts of one kind (two workers)
    are summed under the kind's name.
    """
    pids = {name: pid for name, pid in system.group.pids().items() if name.startswith(PARTS)}
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
        part["CPU ms"] = round(api_figures(pid)[1] * 1000)
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


async def measure(exports: int) -> None:
    folder = Path(tempfile.mkdtemp())
    path = os.pathsep.join([str(COUNTING), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    overrides = {**SETTINGS, "PYTHONPATH": path, "BENCH_COUNTS_DIR": str(folder)}
    async with running_system(workers=2, overrides=overrides) as system:
        pool = await asyncpg.create_pool(system.settings().database_url, min_size=1, max_size=2)
        try:
            async with aiohttp.ClientSession(base_url=system.base_url) as api:
                clients = await prepare(api, system)
                await drain(api, pool, clients, WARM_UP)
                before = await snapshot(system, folder)
                rate = await drain(api, pool, clients, exports)
                after = await snapshot(system, folder)
        finally:
            await pool.close()
    print(f"counts per export of a drain of {exports} exports of 100 messages ({rate:.0f} operations/s):")
    print_per_export(before, after, exports)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exports", type=int, default=EXPORTS)
    asyncio.run(measure(parser.parse_args().exports))


if __name__ == "__main__":
    main()
