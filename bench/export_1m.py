"""Benchmark: export a 1,000,000-message conversation through the running system.

Starts its own system from the compose file (moto server, api, relay, one worker, janitors as processes)
on a fresh database, imports the conversation through the admin API, exports it, and prints: wall time
from 202 to SUCCEEDED, messages/s, MB/s, the worker's peak RSS, and the same rows dumped by Postgres
itself with ``COPY (SELECT ...) TO STDOUT`` in the same run, with the ratio. Usage:

    .venv/bin/python bench/export_1m.py [--messages N] [--batch N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.running import running_system
from bench.table import Figure, print_table
from shared.auth import mint_token
from shared.repository.export_reader import EXPORT_LINES_SQL
from shared.settings import Settings
from shared.storage import open_s3_client

CID = "bench-1m"
# COPY's csv format with quote and delimiter characters that JSON text never contains passes the lines through
# verbatim; the text format would double every backslash.
COPY_OPTIONS = {"format": "csv", "quote": "\x01", "delimiter": "\x02"}
WORDS = ["hello", "world", "export", "message", "你好", "привет", "café", "naïve", "ok", "😀", '"quoted"']
WORDS += ["back\\slash", "tab\tnewline\n"]


def ndjson_batch(start: int, count: int, rng: random.Random) -> bytes:
    lines = []
    for number in range(start, start + count):
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14)))
        line = {"message_id": f"m{number}", "sender_id": f"user{number % 5}", "body": body}
        lines.append(json.dumps(line, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode()


def peak_rss_mb(pid: int) -> float:
    """VmHWM of a live process, in MB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


async def import_messages(api: aiohttp.ClientSession, admin: dict[str, str], total: int, batch: int) -> float:
    started = time.perf_counter()
    async with api.put(f"/admin/conversations/{CID}", json={"members": ["alice"]}, headers=admin) as response:
        assert response.status < 300, await response.text()
    rng = random.Random(7)
    headers = {**admin, "Content-Type": "application/x-ndjson"}
    for start in range(0, total, batch):
        body = ndjson_batch(start, min(batch, total - start), rng)
        async with api.post(f"/admin/conversations/{CID}/messages:import", data=body, headers=headers) as response:
            assert response.status == 200, await response.text()
    return time.perf_counter() - started


async def export(
    api: aiohttp.ClientSession, user: dict[str, str], *, cid: str = CID, body: dict[str, Any] | None = None
) -> tuple[float, dict[str, Any]]:
    """Submit ``body`` (a JSONL export by default) for ``cid`` and poll it to its end: (seconds from the 202 to
    the end, the operation)."""
    headers = {**user, "Idempotency-Key": uuid.uuid4().hex}
    submitted = body or {"format": "jsonl"}
    async with api.post(f"/v3/conversations/{cid}/exports", json=submitted, headers=headers) as response:
        assert response.status == 202, await response.text()
        location = response.headers["Location"]
    started = time.perf_counter()
    while True:
        async with api.get(location, headers=user) as response:
            operation = await response.json()
        if operation["state"] not in ("QUEUED", "RUNNING", "RETRY_AT"):
            return time.perf_counter() - started, operation
        await asyncio.sleep(0.05)  # polling the status monitor, as a client does


async def copy_every_line(
    conn: asyncpg.Connection, last_seq: int, sink: Callable[[bytes], Awaitable[None]], *, cid: str = CID
) -> None:
    """Every JSONL line of conversation ``cid`` up to ``last_seq`` through ``sink``: Postgres' own ``COPY`` of the
    lines an export writes, the same statement with its arguments. No operation's id: every body as it is now,
    which is what an export of unedited messages shows.
    """
    await conn.copy_from_query(
        EXPORT_LINES_SQL,
        cid,
        0,
        last_seq,
        None,
        None,
        None,
        "",
        output=sink,
        **COPY_OPTIONS,
    )


async def copy_baseline(database_url: str, last_seq: int) -> tuple[float, int]:
    """Postgres dumping the same lines itself, into a sink that only counts bytes."""
    conn = await asyncpg.connect(database_url)
    size = 0

    async def sink(chunk: bytes) -> None:
        nonlocal size
        size += len(chunk)

    try:
        started = time.perf_counter()
        await copy_every_line(conn, last_seq, sink)
        return time.perf_counter() - started, size
    finally:
        await conn.close()


async def copy_to_s3_baseline(settings: Settings, last_seq: int) -> float:
    """Postgres dumping the same lines, streamed into one multipart upload on the same S3 (parts of
    ``s3_part_size_bytes``, one in flight while the next fills): the least an export must do.
    """
    conn = await asyncpg.connect(settings.database_url)
    # Outside the janitor's prefixes: it would abort this upload, which no record names, at its first pass,
    # since the emulator lists every upload as initiated years ago (docs/retention.md).
    key = f"bench-baseline-{uuid.uuid4().hex}.jsonl"
    try:
        async with open_s3_client(settings) as s3:
            started = time.perf_counter()
            upload = (await s3.create_multipart_upload(Bucket=settings.s3_bucket, Key=key))["UploadId"]
            parts: list[dict[str, Any]] = []
            buffer = bytearray()
            in_flight: asyncio.Task[None] | None = None

            async def send(chunk: bytes, number: int) -> None:
                uploaded = await s3.upload_part(
                    Bucket=settings.s3_bucket, Key=key, UploadId=upload, PartNumber=number, Body=chunk
                )
                parts.append({"PartNumber": number, "ETag": uploaded["ETag"]})

            started_parts = 0

            async def start_part(chunk: bytes) -> None:
                nonlocal in_flight, started_parts
                if in_flight is not None:
                    await in_flight
                started_parts += 1
                in_flight = asyncio.create_task(send(chunk, started_parts))

            async def sink(chunk: bytes) -> None:
                buffer.extend(chunk)
                if len(buffer) >= settings.s3_part_size_bytes:
                    await start_part(bytes(buffer))
                    buffer.clear()

            await copy_every_line(conn, last_seq, sink)
            await start_part(bytes(buffer))
            assert in_flight is not None
            await in_flight
            parts.sort(key=lambda part: part["PartNumber"])
            await s3.complete_multipart_upload(
                Bucket=settings.s3_bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
            )
            seconds = time.perf_counter() - started
            await s3.delete_object(Bucket=settings.s3_bucket, Key=key)
            return seconds
    finally:
        await conn.close()


async def figures(total: int, batch: int) -> list[Figure]:
    """Run the export and both baselines (see the module's docstring); print the details, return the rows."""
    # One stream (chunking off), against COPY; chunked exports are bench/chunks.py's.
    async with running_system(workers=1, overrides={"CHATEXPORT_CHUNK_THRESHOLD_BYTES": "0"}) as system:
        settings = system.settings()  # the system's own JWT secret
        admin = {"Authorization": f"Bearer {mint_token(settings, user_id='root', scopes=['admin'])}"}
        user = {"Authorization": f"Bearer {mint_token(settings, user_id='alice')}"}
        worker_pid = system.group.pids()["worker"]
        async with aiohttp.ClientSession(base_url=system.base_url) as api:
            import_seconds = await import_messages(api, admin, total, batch)
            idle_rss = peak_rss_mb(worker_pid)
            export_seconds, operation = await export(api, user)
        assert operation["state"] == "SUCCEEDED", operation
        rss = peak_rss_mb(worker_pid)
        copy_seconds, copy_bytes = await copy_baseline(settings.database_url, total)
        to_s3_seconds = await copy_to_s3_baseline(system.settings("worker"), total)
    report(total, import_seconds, export_seconds, operation["result"], rss, idle_rss, copy_seconds, copy_bytes)
    print(f"COPY into one multipart upload {to_s3_seconds:>10.2f} s")
    name = f"{total:,}-message export, 202 -> SUCCEEDED"
    return [
        Figure(name, export_seconds, "s", to_s3_seconds, "COPY into one multipart upload", "<= 1.05"),
        Figure(name, export_seconds, "s", copy_seconds, "COPY to nowhere"),
        Figure(f"worker peak RSS during the export (before it: {idle_rss:.0f} MB)", rss, "MB", target="<= 110 MB"),
    ]


def report(
    total: int,
    import_s: float,
    export_s: float,
    result: dict[str, Any],
    rss: float,
    idle_rss: float,
    copy_s: float,
    copy_bytes: int,
) -> None:
    size_mb = result["size_bytes"] / 1e6
    assert result["message_count"] == total and result["size_bytes"] == copy_bytes
    print(f"messages                     {total:>12,}")
    print(f"file size                    {size_mb:>12.1f} MB")
    print(f"import via admin API         {import_s:>12.2f} s   ({total / import_s:,.0f} messages/s)")
    print(f"export, 202 -> SUCCEEDED     {export_s:>12.2f} s")
    print(f"  messages/s                 {total / export_s:>12,.0f}")
    print(f"  MB/s                       {size_mb / export_s:>12.1f}")
    print(f"worker peak RSS              {rss:>12.1f} MB   (before the export: {idle_rss:.1f} MB)")
    print(f"Postgres COPY of same rows   {copy_s:>12.2f} s   ({total / copy_s:,.0f} messages/s)")
    print(f"ratio export / COPY          {export_s / copy_s:>12.2f} x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10_000)
    args = parser.parse_args()
    print_table(asyncio.run(figures(args.messages, args.batch)))


if __name__ == "__main__":
    main()
