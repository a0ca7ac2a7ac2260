"""Every benchmark of ``make bench`` but the recovery latencies, each with its baseline from the same run,
printed as one table (docs/benchmark.md: Benchmark). Each starts a system of its own. Usage:

    .venv/bin/python bench/all.py [--messages N] [--exports N]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import callbacks, drain, export_1m, http_load, token_keys, tracing_cost, waiters
from bench.table import Figure, print_table


async def figures(messages: int, exports: int) -> list[Figure]:
    return [
        *await http_load.figures(seconds=10),
        *await tracing_cost.figures(seconds=10),
        *await token_keys.figures(seconds=10),
        *await drain.figures(exports, samples=100),
        *await callbacks.figures(callbacks.BACKLOG),
        *await waiters.figures(),
        *await export_1m.figures(messages, batch=10_000),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--exports", type=int, default=1500)
    args = parser.parse_args()
    table = asyncio.run(figures(args.messages, args.exports))
    print()
    print_table(table)


if __name__ == "__main__":
    main()
