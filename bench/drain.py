"""Benchmark: how fast small exports go through the whole system, and how long one takes when nothing else
runs.

Starts its own system from the compose file (two workers, ``make run``'s other settings) on a fresh
database, with ``CLIENTS`` users each a member of a conversation of 100 messages, and measures:

- the drain: ``EXPORTS`` exports submitted by ``CLIENTS`` concurrent clients (the quota raised so none is
  refused), from the first submit's creation to the last SUCCEEDED, in operations per second;
- the latency of one export of 100 messages submitted alone, one after the other: from its creation to its
  SUCCEEDED commit, both by the database's clock, p50 and p99.

Usage:

    .venv/bin/python bench/drain.py [--exports N] [--samples N]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from pathlib import Path

import aiohttp
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.running import admin_headers, member_conversation, running_system
from bench.table import Figure, percentile, print_table
from devtools.localsystem import LocalSystem
from shared.auth import mint_token

CLIENTS = 16
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
        await member_conversation(api, admin, user=user, cid=cid, messages=100, body="message of the drain")
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


async def figures(exports: int, samples: int) -> list[Figure]:
    """Start a system, prepare it, and measure (see the module's docstring)."""
    async with running_system(workers=2, overrides=SETTINGS) as system:
        pool = await asyncpg.create_pool(system.settings().database_url, min_size=1, max_size=2)
        try:
            async with aiohttp.ClientSession(base_url=system.base_url) as api:
                clients = await prepare(api, system)
                alone = await latencies(api, pool, *clients[0], samples)
                rate = await drain(api, pool, clients, exports)
        finally:
            await pool.close()
    return [
        Figure(f"drain: {exports} exports of 100 messages, {CLIENTS} clients, 2 workers", rate, "operations/s",
               target=">= 300/s"),
        Figure("202 -> SUCCEEDED, 100 messages, alone: p50", percentile(alone, 0.5), "ms", target="<= 20 ms"),
        Figure("202 -> SUCCEEDED, 100 messages, alone: p99", percentile(alone, 0.99), "ms", target="<= 60 ms"),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exports", type=int, default=1500)
    parser.add_argument("--samples", type=int, default=100)
    args = parser.parse_args()
    print_table(asyncio.run(figures(args.exports, args.samples)))


if __name__ == "__main__":
    main()
