"""Benchmark: completion callbacks a second (docs/benchmark.md: Benchmark, Callbacks). A backlog of
``BACKLOG`` due callbacks, written while every part is stopped (SIGSTOP), is drained by the system's one relay
into a local https receiver in this process; the baseline, in the same run, is a bare client in a process of
its own posting as many bodies of the same size to the same receiver, 16 at a time (the relay's batch) over
kept connections, with no database. Each is measured alone. Usage:

    .venv/bin/python bench/callbacks.py [--backlog N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import ssl
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.running import running_system
from bench.table import Figure, print_table
from devtools.certificates import certificate_for

BACKLOG = 10_000
CONCURRENCY = 16
TIMEOUT_SECONDS = 600
BODY_BYTES = 800  # about a callback's: an operation's representation in a Standard Webhooks message


class Tally:
    """The body length of each request received, and an event set once ``expected`` have arrived."""

    def __init__(self) -> None:
        self.lengths: list[int] = []
        self.expected = 0
        self.complete = asyncio.Event()

    def expect(self, count: int) -> None:
        """Start over, waiting for ``count`` requests."""
        self.lengths.clear()
        self.expected = count
        self.complete.clear()

    def add(self, length: int) -> None:
        self.lengths.append(length)
        if len(self.lengths) >= self.expected:
            self.complete.set()


@contextlib.asynccontextmanager
async def receiver(tls: ssl.SSLContext) -> AsyncIterator[tuple[Tally, int]]:
    """An https receiver on a free port of 127.0.0.1 answering 204 to every POST, for the block; yields
    its ``Tally`` and the port.
    """
    tally = Tally()

    async def hook(request: web.Request) -> web.Response:
        tally.add(len(await request.read()))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    try:
        yield tally, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def bare_client(url: str, cafile: str, count: int) -> None:
    """Post ``count`` bodies to ``url``, ``CONCURRENCY`` at a time over one kept session (a process's target)."""

    async def post_all() -> None:
        context = ssl.create_default_context(cafile=cafile)
        queue = iter(range(count))
        async with aiohttp.ClientSession() as session:

            async def post_next() -> None:
                for _ in queue:
                    async with session.post(url, data=b"x" * BODY_BYTES, ssl=context) as response:
                        await response.read()

            await asyncio.gather(*(post_next() for _ in range(CONCURRENCY)))

    asyncio.run(post_all())


async def backlog(database_url: str, url: str, count: int) -> None:
    """``count`` operations with ``url`` to notify, ended FAILED in one statement: the trigger queues one due
    callback each.
    """
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO operations (operation_id, owner_id, conversation_id, format, state, notify_url)"
            " SELECT 'op_callback_' || n, 'bench-user', 'bench-conversation', 'jsonl', 'RUNNING', $2"
            " FROM generate_series(1, $1) AS n",
            count,
            url,
        )
        await conn.execute("UPDATE operations SET state = 'FAILED', error_code = 'BENCH' WHERE state = 'RUNNING'")
    finally:
        await conn.close()


async def figures(count: int) -> list[Figure]:
    """The relay's callbacks a second against the bare client's, ``count`` each."""
    folder = Path(tempfile.mkdtemp())
    server_tls, _ = certificate_for("127.0.0.1", folder)
    cafile = str(folder / "cert.pem")
    async with receiver(server_tls) as (tally, port):
        url = f"https://127.0.0.1:{port}/hook"
        tally.expect(count)
        started = time.perf_counter()
        bare = multiprocessing.get_context("spawn").Process(target=bare_client, args=(url, cafile, count))
        bare.start()
        await asyncio.wait_for(tally.complete.wait(), TIMEOUT_SECONDS)
        bare_rate = count / (time.perf_counter() - started)
        bare.join()
        tally.expect(count)
        # Private receivers are a development setting: the receiver is on this machine.
        overrides = {
            "CHATEXPORT_ENVIRONMENT": "development",
            "CHATEXPORT_WEBHOOK_ALLOW_PRIVATE": "true",
            "SSL_CERT_FILE": cafile,
        }
        async with running_system(workers=1, overrides=overrides) as system:
            relays = [name for name in system.group.pids() if name.startswith("relay")]
            others = [name for name in system.group.pids() if name not in relays]
            with system.group.paused(others):
                with system.group.paused(relays):
                    await backlog(system.settings().database_url, url, count)
                started = time.perf_counter()
                await asyncio.wait_for(tally.complete.wait(), TIMEOUT_SECONDS)
                relay_rate = count / (time.perf_counter() - started)
    smallest = min(tally.lengths)
    print(f"callbacks: relay {relay_rate:,.0f}/s, bare client {bare_rate:,.0f}/s, bodies of {smallest} bytes and up")
    return [
        Figure(
            f"callbacks, a backlog of {count:,} to a local https receiver",
            relay_rate,
            "callbacks/s",
            bare_rate,
            "a bare client, same receiver",
            ">= 200/s",
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=BACKLOG)
    args = parser.parse_args()
    print_table(asyncio.run(figures(args.backlog)))


if __name__ == "__main__":
    main()
