"""Benchmark: chunked exports (docs/chunks.md: Chunked exports) through the running system.

One conversation of ``--messages`` messages (about 200 bytes of JSONL each) is loaded once in SQL into a
template database; every system below runs on a copy of it, with chunks of ``CHUNK_TARGET_MIB`` and one chunk
slot per worker, so that N workers run N chunks at once. Printed, each against the one-worker run of the same
kind in this run:

- speed-up with 1, 2 and 4 workers, (a) against moto as it is and (b) through a proxy that limits each S3
  connection to ``THROTTLE_BYTES_PER_SECOND`` (so that the machine's CPU is not the limit), each phase:
  planning, writing the chunks, assembly with the verifying read, and the whole export;
- crash cost: a worker holding a chunk SIGKILLed once 50 % and once 90 % of the export's chunks are done
  (two workers): the bytes written again over the file's size, and the time over the undisturbed two-worker
  time;
- a coordinator's takeover: the worker holding the export's lease SIGKILLed once half of the file is in its
  upload's parts (two workers): the bytes the coordinator that takes over reads, over the file's size, beside
  the share of the file not yet in parts when it was killed (docs/chunks.md: A coordinator's takeover);
- a cancel's ``202`` -> CANCELED with four chunks of the export running;
- a 100-message export's 202 -> SUCCEEDED while two chunked exports keep every worker's chunk slot busy.

Usage: ``.venv/bin/python bench/chunks.py [--messages N] [--samples N]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.running import PG_SERVER, admin_execute, admin_headers, member_conversation, proxied_system
from bench.table import Figure, percentile, print_table
from devtools.localsystem import LocalSystem
from shared.auth import mint_token
from shared.migrator import migrate

CID = "bench-chunks"
MIB = 1024 * 1024
CHUNK_TARGET_MIB = 16
THROTTLE_BYTES_PER_SECOND = 4_000_000
SETTINGS = {
    "CHATEXPORT_CHUNK_THRESHOLD_BYTES": str(8 * MIB),
    "CHATEXPORT_CHUNK_TARGET_BYTES": str(CHUNK_TARGET_MIB * MIB),
    "CHATEXPORT_WORKER_CHUNK_CONCURRENCY": "1",
    "CHATEXPORT_LEASE_SECONDS": "5",
    "CHATEXPORT_HEARTBEAT_SECONDS": "1",
    "CHATEXPORT_JANITOR_INTERVAL_SECONDS": "1",
    "CHATEXPORT_JANITOR_REQUEUE_AFTER_SECONDS": "2",
    "CHATEXPORT_MAX_ACTIVE_EXPORTS": "1000",
    # A part through a throttled connection takes seconds: not a timeout.
    "CHATEXPORT_S3_TIMEOUT_SECONDS": "120",
}
WORKER_COUNTS = (1, 2, 4)
EXPORT_TIMEOUT_SECONDS = 900.0


@dataclass(frozen=True)
class Phases:
    """One chunked export's phases, in seconds: planning (claim to plan), writing (plan to the last chunk
    DONE), assembly (to SUCCEEDED, the verifying read included) and the whole export (202 to SUCCEEDED).
    """

    planning: float
    writing: float
    assembly: float
    whole: float
    size_bytes: int
    chunks: int


async def seeded_template(messages: int) -> str:
    """A migrated database holding ``CID`` with alice and ``messages`` messages; its name."""
    name = f"chatexport_bench_seed_{uuid.uuid4().hex[:8]}"
    await admin_execute(f'CREATE DATABASE "{name}"')
    url = f"{PG_SERVER}/{name}"
    try:
        await migrate(url)
        await _load(url, messages)
    except BaseException:
        await drop_database(name)
        raise
    return name


async def _load(url: str, messages: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("INSERT INTO conversations (conversation_id, last_seq) VALUES ($1, $2)", CID, messages)
        await conn.execute("INSERT INTO conversation_members (conversation_id, user_id) VALUES ($1, 'alice')", CID)
        # Bodies of 8 to 90 bytes of hex, about as the 1M benchmark's words make them.
        await conn.execute(
            """
            INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at)
            SELECT $1, n, 'm' || n, 'user' || (n % 5), left(md5(n::text) || md5((n * 7)::text) || md5((n * 13)::text),
                   (8 + (n * 7919) % 83)::int),
                   timestamptz '2026-01-01Z' + n * interval '1 second'
            FROM generate_series(1, $2::bigint) AS n
            """,
            CID,
            messages,
        )
    finally:
        await conn.close()


async def drop_database(name: str) -> None:
    await admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.asynccontextmanager
async def system_on(template: str, *, workers: int, throttled: bool) -> AsyncIterator[LocalSystem]:
    """A system with ``workers`` workers on a copy of ``template``, its S3 behind a proxy that limits each
    connection when ``throttled``.
    """
    async with proxied_system(workers=workers, overrides=SETTINGS, template=template) as running:
        assert running.proxy is not None
        if throttled:
            running.proxy.throttle(THROTTLE_BYTES_PER_SECOND, per_connection=True)
        yield running.system


async def submit(api: aiohttp.ClientSession, system: LocalSystem, cid: str = CID) -> str:
    user = {"Authorization": f"Bearer {mint_token(system.settings(), user_id='alice')}"}
    headers = {**user, "Idempotency-Key": uuid.uuid4().hex}
    async with api.post(f"/v3/conversations/{cid}/exports", json={}, headers=headers) as response:
        assert response.status == 202, await response.text()
        operation_id: str = (await response.json())["operation_id"]
    return operation_id


async def wait_succeeded(pool: asyncpg.Pool, operation_id: str) -> asyncpg.Record:
    """The operation's row once SUCCEEDED; fails on any other end, or after ``EXPORT_TIMEOUT_SECONDS``."""
    async with asyncio.timeout(EXPORT_TIMEOUT_SECONDS):
        while True:
            row = await pool.fetchrow("SELECT * FROM operations WHERE operation_id = $1", operation_id)
            if row["state"] == "SUCCEEDED":
                return row
            assert row["state"] in ("QUEUED", "RUNNING", "RETRY_AT"), dict(row)
            await asyncio.sleep(0.05)  # polling another process's progress


async def phases(pool: asyncpg.Pool, operation_id: str, whole: float) -> Phases:
    row = await pool.fetchrow(
        """
        SELECT (SELECT min(claimed_at) FROM attempts WHERE operation_id = $1) AS claimed,
               min(c.created_at) AS planned, max(c.updated_at) AS written, o.finished_at, o.result_size_bytes,
               count(*) AS chunks
        FROM export_chunks c JOIN operations o USING (operation_id) WHERE operation_id = $1
        GROUP BY o.finished_at, o.result_size_bytes
        """,
        operation_id,
    )
    assert row is not None and row["chunks"] > 1, f"{operation_id} was not chunked"
    return Phases(
        planning=_seconds(row["claimed"], row["planned"]),
        writing=_seconds(row["planned"], row["written"]),
        assembly=_seconds(row["written"], row["finished_at"]),
        whole=whole,
        size_bytes=row["result_size_bytes"],
        chunks=row["chunks"],
    )


def _seconds(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds()


async def one_export(template: str, *, workers: int, throttled: bool) -> Phases:
    async with (
        system_on(template, workers=workers, throttled=throttled) as system,
        aiohttp.ClientSession(base_url=system.base_url) as api,
        asyncpg.create_pool(system.settings().database_url, min_size=1, max_size=2) as pool,
    ):
        started = time.perf_counter()
        operation_id = await submit(api, system)
        await wait_succeeded(pool, operation_id)
        return await phases(pool, operation_id, time.perf_counter() - started)


async def crash_cost(template: str, fraction: float) -> tuple[float, float]:
    """(bytes written again / file size, seconds) of an export whose chunk holder is SIGKILLed at
    ``fraction`` of its messages, with two workers.
    """
    async with (
        system_on(template, workers=2, throttled=False) as system,
        aiohttp.ClientSession(base_url=system.base_url) as api,
        asyncpg.create_pool(system.settings().database_url, min_size=1, max_size=2) as pool,
    ):
        started = time.perf_counter()
        operation_id = await submit(api, system)
        holder = await _chunk_holder_at(pool, operation_id, fraction)
        system.group.kill(system.holder(holder))
        await wait_succeeded(pool, operation_id)
        seconds = time.perf_counter() - started
        again = await pool.fetchval(
            "SELECT coalesce(sum(size_bytes), 0) FROM export_chunks WHERE operation_id = $1 AND generation > 1",
            operation_id,
        )
        size = await pool.fetchval("SELECT result_size_bytes FROM operations WHERE operation_id = $1", operation_id)
        return again / size, seconds


async def coordinator_crash_cost(template: str) -> tuple[float, float]:
    """(bytes the coordinator that takes over reads / file size, share of the file not yet in parts at the kill)
    of an export whose coordinator is SIGKILLed once half of the file is in its upload's parts, two workers.
    """
    async with (
        system_on(template, workers=2, throttled=False) as system,
        aiohttp.ClientSession(base_url=system.base_url) as api,
        asyncpg.create_pool(system.settings().database_url, min_size=1, max_size=2) as pool,
    ):
        operation_id = await submit(api, system)
        sql = """
            SELECT (a.assembly ->> 'size_bytes')::bigint AS in_parts, o.lease_owner, o.state,
                   (SELECT sum(estimated_bytes) FROM export_chunks WHERE operation_id = $1) AS estimated
            FROM operations o JOIN artifacts a ON a.operation_id = o.operation_id AND a.generation = o.generation
            WHERE o.operation_id = $1
        """
        async with asyncio.timeout(EXPORT_TIMEOUT_SECONDS):
            while True:
                row = await pool.fetchrow(sql, operation_id)  # none before the claim
                # Half of the file as the plan estimates it; the share is taken again of the real size below.
                if row is not None and row["in_parts"] is not None and row["in_parts"] * 2 >= row["estimated"]:
                    break
                assert row is None or row["state"] != "SUCCEEDED", "the export ended before half was in parts"
                await asyncio.sleep(0.01)  # polling another process's progress
        killed = system.holder(row["lease_owner"])
        system.group.kill(killed)
        in_parts = await pool.fetchval(
            "SELECT (assembly ->> 'size_bytes')::bigint FROM artifacts WHERE operation_id = $1 AND generation = ("
            " SELECT generation FROM operations WHERE operation_id = $1)",
            operation_id,
        )
        await wait_succeeded(pool, operation_id)
        size = await pool.fetchval("SELECT result_size_bytes FROM operations WHERE operation_id = $1", operation_id)
        survivor = next(name for name in system.metrics_ports if name.startswith("worker") and name != killed)
        async with aiohttp.ClientSession() as scrape:
            url = f"http://127.0.0.1:{system.metrics_ports[survivor]}/metrics"
            async with scrape.get(url) as response:
                text = await response.text()
        read = next(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "chatexport_worker_assembly_bytes_read_total"
        )
        return read / size, 1 - in_parts / size


async def _chunk_holder_at(pool: asyncpg.Pool, operation_id: str, fraction: float) -> str:
    """Wait until ``fraction`` of the export's chunks are DONE while another one runs; the lease owner of a
    running chunk then. Fails when the export ends first.
    """
    sql = """
        SELECT count(*) FILTER (WHERE state = 'DONE') >= $2 * count(*) AND count(*) > 0 AS far_enough,
               min(lease_owner) FILTER (WHERE state = 'RUNNING') AS holder,
               (SELECT state FROM operations WHERE operation_id = $1) AS operation_state
        FROM export_chunks WHERE operation_id = $1
    """
    async with asyncio.timeout(EXPORT_TIMEOUT_SECONDS):
        while True:
            row = await pool.fetchrow(sql, operation_id, fraction)
            if row["far_enough"] and row["holder"] is not None:
                holder: str = row["holder"]
                return holder
            assert row["operation_state"] != "SUCCEEDED", f"the export ended before {fraction:.0%} of its chunks"
            await asyncio.sleep(0.01)  # polling another process's progress


async def small_latencies(template: str, samples: int) -> list[float]:
    """202 -> SUCCEEDED of ``samples`` 100-message exports, one after the other, while two chunked exports
    run on two workers (each worker's chunk slot busy).
    """
    async with (
        system_on(template, workers=2, throttled=False) as system,
        aiohttp.ClientSession(base_url=system.base_url) as api,
        asyncpg.create_pool(system.settings().database_url, min_size=1, max_size=2) as pool,
    ):
        await member_conversation(api, admin_headers(system), user="alice", cid="small", messages=100, body="hi")
        big = [await submit(api, system) for _ in range(2)]
        await _chunk_holder_at(pool, big[0], 0.0)
        latencies = []
        for _ in range(samples):
            started = time.perf_counter()
            await wait_succeeded(pool, await submit(api, system, "small"))
            latencies.append(time.perf_counter() - started)
        busy = await pool.fetchval(
            "SELECT count(*) FROM operations WHERE operation_id = ANY($1) AND state = 'RUNNING'", big
        )
        print(f"chunked exports still running after the samples: {busy} of 2")
        return latencies


async def cancel_latencies(template: str, samples: int) -> list[float]:
    """Seconds from a cancel's ``202`` to CANCELED, each for a chunked export with four chunks running (two
    workers with two chunk slots each).
    """
    overrides = {**SETTINGS, "CHATEXPORT_WORKER_CHUNK_CONCURRENCY": "2", "CHATEXPORT_CHUNKS_PER_EXPORT": "4"}
    async with (
        proxied_system(workers=2, overrides=overrides, template=template) as running,
        aiohttp.ClientSession(base_url=running.system.base_url) as api,
        asyncpg.create_pool(running.system.settings().database_url, min_size=1, max_size=2) as pool,
    ):
        system = running.system
        user = {"Authorization": f"Bearer {mint_token(system.settings(), user_id='alice')}"}
        latencies = []
        for _ in range(samples):
            operation_id = await submit(api, system)
            await _running_chunks(pool, operation_id, 4)
            async with api.post(f"/v3/operations/{operation_id}/cancel", headers=user) as response:
                assert response.status == 202, await response.text()
            started = time.perf_counter()
            await until(pool, "SELECT state FROM operations WHERE operation_id = $1", operation_id, "CANCELED".__eq__)
            latencies.append(time.perf_counter() - started)
        return latencies


async def _running_chunks(pool: asyncpg.Pool, operation_id: str, count: int) -> None:
    sql = "SELECT count(*) FROM export_chunks WHERE operation_id = $1 AND state = 'RUNNING'"
    await until(pool, sql, operation_id, lambda running: running >= count)


async def until(pool: asyncpg.Pool, sql: str, argument: str, done: Callable[[Any], bool]) -> Any:
    """Poll ``sql`` (one value, of ``argument``) until ``done`` says yes; return the value. Fails after
    ``EXPORT_TIMEOUT_SECONDS``.
    """
    async with asyncio.timeout(EXPORT_TIMEOUT_SECONDS):
        while not done(value := await pool.fetchval(sql, argument)):  # noqa: ASYNC110 - another process's rows
            await asyncio.sleep(0.01)
    return value


async def figures(messages: int, samples: int) -> list[Figure]:
    template = await seeded_template(messages)
    try:
        table: list[Figure] = []
        for throttled in (False, True):
            table += await speed_up(template, throttled=throttled)
        one = await one_export(template, workers=2, throttled=False)
        for fraction in (0.5, 0.9):
            again, seconds = await crash_cost(template, fraction)
            name = f"SIGKILL of a chunk holder at {fraction:.0%} (2 workers)"
            table.append(Figure(f"{name}: bytes written again / file size", again * 100, "%", target="<= its chunks"))
            table.append(Figure(f"{name}: time", seconds, "s", one.whole, "undisturbed, 2 workers"))
        read, not_in_parts = await coordinator_crash_cost(template)
        table.append(
            Figure(
                "SIGKILL of the coordinator with half of the file in parts (2 workers): bytes read by the"
                " coordinator that takes over / file size",
                read * 100,
                "%",
                target=f"<= the share not yet in parts: {not_in_parts:.0%}",
            )
        )
        cancels = await cancel_latencies(template, samples)
        for label, fraction in (("p50", 0.5), ("p99", 0.99)):
            value = percentile(cancels, fraction)
            table.append(
                Figure(f"cancel's 202 -> CANCELED, 4 chunks running, {label}", value, "s", target="p99 <= 2 s")
            )
        latencies = await small_latencies(template, samples)
        for label, fraction in (("p50", 0.5), ("p99", 0.99)):
            value = percentile(latencies, fraction)
            table.append(Figure(f"100-message export beside chunked ones, {label}", value, "s", target="p99 <= 3 s"))
        return table
    finally:
        await drop_database(template)


async def speed_up(template: str, *, throttled: bool) -> list[Figure]:
    kind = f"S3 limited to {THROTTLE_BYTES_PER_SECOND / 1e6:.0f} MB/s per connection" if throttled else "moto as is"
    runs = {workers: await one_export(template, workers=workers, throttled=throttled) for workers in WORKER_COUNTS}
    base = runs[1]
    print(f"\n{kind}: {base.size_bytes / 1e6:.0f} MB in {base.chunks} chunks")
    print("workers | planning s | writing s | assembly s | whole s")
    for workers, run in runs.items():
        print(f"{workers} | {run.planning:.2f} | {run.writing:.2f} | {run.assembly:.2f} | {run.whole:.2f}")
    table = []
    for workers, run in runs.items():
        if workers == 1:
            continue
        targets = (0.75, 0.65) if throttled else (None, None)
        for phase, value, baseline, target in (
            ("writing", run.writing, base.writing, targets[0]),
            ("whole export", run.whole, base.whole, targets[1]),
        ):
            goal = "" if target is None else f"speed-up >= {target * workers:.1f}"
            # The one-worker time over this one: the ratio column reads as the speed-up.
            name = f"{kind}: {phase}, 1 worker against {workers}"
            table.append(Figure(name, baseline, "s", value, f"{workers} workers", goal))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    table = asyncio.run(figures(args.messages, args.samples))
    print()
    print_table(table)


if __name__ == "__main__":
    main()
