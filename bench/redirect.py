"""Benchmark: a big download by redirect against the same download streamed through the API (docs/api.md: Downloads,
Download by redirect).

One conversation whose JSONL export is about ``--megabytes`` MB (bodies of 10,000 bytes) is loaded in SQL
and exported once by the running system; then the file is downloaded ``--samples`` times each way, alternating:
streamed (``GET .../result``, every byte through the api) and by redirect (the ``303``, then the presigned
URL fetched from the storage without the token). Printed: the api process's CPU seconds per download (from
``/proc``) and the wall time, the redirect's against the streamed ones of the same run.

Usage: ``.venv/bin/python bench/redirect.py [--megabytes N] [--samples N]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.running import running_system
from bench.table import Figure, median, print_table
from devtools.localsystem import LocalSystem
from shared.auth import mint_token

CID = "bench-redirect"
BODY_BYTES = 10_000
READ_BYTES = 1024 * 1024
# One stream, so that the file is the same kind of object whatever the machine.
SETTINGS = {"CHATEXPORT_CHUNK_THRESHOLD_BYTES": "0", "CHATEXPORT_MAX_ACTIVE_EXPORTS": "1000"}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process ``pid`` has used (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(system: LocalSystem, megabytes: int) -> None:
    """``CID`` with alice and enough messages of ``BODY_BYTES`` for about ``megabytes`` MB of JSONL."""
    messages = megabytes * 1_000_000 // (BODY_BYTES + 150)
    conn = await asyncpg.connect(system.settings().database_url)
    try:
        await conn.execute("INSERT INTO conversations (conversation_id, last_seq) VALUES ($1, $2)", CID, messages)
        await conn.execute("INSERT INTO conversation_members (conversation_id, user_id) VALUES ($1, 'alice')", CID)
        await conn.execute(
            """
            INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at)
            SELECT $1, n, 'm' || n, 'alice', repeat(md5(n::text), $3 / 32),
                   timestamptz '2026-01-01Z' + n * interval '1 s'
            FROM generate_series(1, $2::bigint) AS n
            """,
            CID,
            messages,
            BODY_BYTES,
        )
    finally:
        await conn.close()


async def exported(api: aiohttp.ClientSession, user: dict[str, str]) -> dict[str, object]:
    """The result of alice's export of ``CID``, once SUCCEEDED."""
    headers = {**user, "Idempotency-Key": uuid.uuid4().hex}
    async with api.post(f"/v3/conversations/{CID}/exports", json={}, headers=headers) as response:
        assert response.status == 202, await response.text()
        location = response.headers["Location"]
    while True:
        async with api.get(location, params={"wait": "30"}, headers=user) as response:
            operation = await response.json()
        if operation["state"] == "SUCCEEDED":
            result: dict[str, object] = operation["result"]
            return result
        assert operation["state"] in ("PENDING", "RUNNING", "RETRY_AT"), operation


async def drain(response: aiohttp.ClientResponse) -> int:
    size = 0
    async for data in response.content.iter_chunked(READ_BYTES):
        size += len(data)
    return size


async def streamed(api: aiohttp.ClientSession, user: dict[str, str], url: str) -> int:
    async with api.get(url, headers=user) as response:
        assert response.status == 200
        return await drain(response)


async def redirected(api: aiohttp.ClientSession, user: dict[str, str], url: str) -> int:
    async with api.get(url, params={"delivery": "redirect"}, headers=user, allow_redirects=False) as response:
        assert response.status == 303, await response.text()
        location = response.headers["Location"]
    async with aiohttp.ClientSession() as storage, storage.get(location) as response:
        assert response.status == 200
        return await drain(response)


async def figures(megabytes: int, samples: int) -> list[Figure]:
    async with running_system(workers=2, overrides=SETTINGS) as system:
        await load(system, megabytes)
        api_pid = system.group.pids()["api"]
        user = {"Authorization": f"Bearer {mint_token(system.settings(), user_id='alice')}"}
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(base_url=system.base_url, timeout=timeout) as api:
            result = await exported(api, user)
            url = str(result["url"])
            runs: dict[str, list[tuple[float, float]]] = {"streamed": [], "redirect": []}
            for _ in range(samples):
                for way, fetch in (("streamed", streamed), ("redirect", redirected)):
                    cpu, wall = cpu_seconds(api_pid), time.perf_counter()
                    size = await fetch(api, user, url)
                    runs[way].append((cpu_seconds(api_pid) - cpu, time.perf_counter() - wall))
                    assert size == result["size_bytes"], (size, result["size_bytes"])
    size_mb = int(str(result["size_bytes"])) / 1e6
    print(f"\none file of {size_mb:.0f} MB, {samples} downloads each way")
    table = []
    for index, (what, unit) in enumerate((("api CPU per download", "s"), ("wall time per download", "s"))):
        product = median([run[index] for run in runs["redirect"]])
        baseline = median([run[index] for run in runs["streamed"]])
        table.append(Figure(f"{size_mb:.0f} MB download: {what}, redirect", product, unit, baseline, "streamed"))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    table = asyncio.run(figures(args.megabytes, args.samples))
    print()
    print_table(table)


if __name__ == "__main__":
    main()
