"""Benchmark: the read of an export's JSONL lines (docs/benchmark.md: The read of an export's lines), the query
the worker runs (``export_reader.fetch_export_lines``: prepared once per connection, each line the bytes of a
bytea) against the ``COPY`` of the same statement with its arguments, as asyncpg runs it (it prepares the
statement and asks Postgres to quote the arguments first, then sends the ``COPY``), on one connection, for a
small export's 100 lines and for a range of 40,000 (about one upload part). Prints the wall time and this
process's CPU time per read.

Usage: ``.venv/bin/python bench/read_lines.py [--reads N]``
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.export_1m import copy_every_line
from bench.running import PG_SERVER, admin_execute
from bench.table import Figure, print_table
from shared.export.request import ExportRequest
from shared.migrator import migrate
from shared.repository.export_reader import fetch_export_lines

CID = "bench-lines"
SIZES = (100, 40_000)


async def timed(read: Callable[[], Awaitable[object]], reads: int) -> tuple[float, float]:
    """(wall ms, this process's CPU ms) per call of ``read``, after a tenth as many calls to warm up."""
    for _ in range(max(1, reads // 10)):
        await read()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(reads):
        await read()
    return (time.perf_counter() - wall) / reads * 1000, (time.process_time() - cpu) / reads * 1000


async def figures(reads: int) -> list[Figure]:
    name = f"chatexport_bench_{uuid.uuid4().hex[:8]}"
    await admin_execute(f'CREATE DATABASE "{name}"')
    try:
        await migrate(f"{PG_SERVER}/{name}")
        conn = await asyncpg.connect(f"{PG_SERVER}/{name}")
        try:
            await conn.execute("INSERT INTO conversations (conversation_id, last_seq) VALUES ($1, $2)", CID, 40_000)
            await conn.execute(
                "INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at)"
                " SELECT $1, n, 'm' || n, 'alice', repeat('x', 60 + n % 80), now() FROM generate_series(1, 40000) n",
                CID,
            )
            table = []
            for lines in SIZES:

                async def fetched(lines: int = lines) -> bytes:
                    return await fetch_export_lines(
                        conn, operation_id="", conversation_id=CID, after_seq=0, last_seq=lines, request=ExportRequest()
                    )

                async def copied(lines: int = lines) -> list[bytes]:
                    out: list[bytes] = []

                    async def sink(data: bytes) -> None:
                        out.append(data)

                    await copy_every_line(conn, lines, sink, cid=CID)
                    return out

                assert await fetched() == b"".join(await copied())
                count = reads if lines == SIZES[0] else max(1, reads // 100)
                fetch_wall, fetch_cpu = await timed(fetched, count)
                copy_wall, copy_cpu = await timed(copied, count)
                table.append(Figure(f"{lines} lines: wall time", fetch_wall, "ms", copy_wall, "COPY with arguments"))
                table.append(Figure(f"{lines} lines: client CPU", fetch_cpu, "ms", copy_cpu, "COPY with arguments"))
            return table
        finally:
            await conn.close()
    finally:
        await admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=1000)
    args = parser.parse_args()
    print_table(asyncio.run(figures(args.reads)))


if __name__ == "__main__":
    main()
