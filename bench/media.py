"""Benchmark: an export with media (docs/api.md: Submitting an export, Exports with media) against copying the same
files into one multipart upload.

Starts its own system (one worker) on a fresh database, uploads ``--files`` attachments of ``--file-bytes`` each
through the API, sends them in as many messages among ``--messages`` (the rest imported as text), exports the
conversation with ``"media": true`` and prints: 202 -> SUCCEEDED, the ZIP's size, the worker's peak RSS against
its Kubernetes memory limit, and the baseline in the same run: every attachment object read from the bucket and
written in order into one multipart upload of the worker's part size, with nothing else. Usage:

    .venv/bin/python bench/media.py [--messages N] [--files N] [--file-bytes N] [--profile FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.export_1m import export, ndjson_batch, peak_rss_mb
from bench.running import running_system
from bench.table import Figure, print_table
from shared.auth import mint_token
from shared.object_writer import ObjectWriter
from shared.settings import Settings
from shared.storage import open_s3_client

CID = "bench-media"
# The worker's memory limit in deploy/kubernetes/base/worker.yaml.
WORKER_LIMIT_MB = 512
UPLOADS_AT_ONCE = 8


async def upload_files(api: aiohttp.ClientSession, user: dict[str, str], files: int, size: int) -> list[str]:
    """``files`` attachments of ``size`` random bytes each, ``UPLOADS_AT_ONCE`` at a time: their ids."""
    ids: list[str] = [""] * files
    data = os.urandom(size)

    async def one(number: int) -> None:
        headers = {**user, "Content-Type": "image/png"}
        # Each file differs in its first bytes, so that no two are the same object.
        body = number.to_bytes(8, "big") + data[8:]
        async with api.post(
            f"/v2/conversations/{CID}/attachments", params={"name": "image.png"}, data=body, headers=headers
        ) as response:
            assert response.status == 201, await response.text()
            ids[number] = (await response.json())["attachment_id"]

    for start in range(0, files, UPLOADS_AT_ONCE):
        await asyncio.gather(*(one(number) for number in range(start, min(start + UPLOADS_AT_ONCE, files))))
    return ids


async def fill(api: aiohttp.ClientSession, admin: dict[str, str], user: dict[str, str], args: Any) -> list[str]:
    """The conversation: ``args.messages - args.files`` text messages imported, then one message per file."""
    async with api.put(f"/admin/conversations/{CID}", json={"members": ["alice"]}, headers=admin) as response:
        assert response.status < 300, await response.text()
    text = args.messages - args.files
    headers = {**admin, "Content-Type": "application/x-ndjson"}
    for start in range(0, text, 5000):
        body = ndjson_batch(start, min(5000, text - start), random.Random(start))
        async with api.post(f"/admin/conversations/{CID}/messages:import", data=body, headers=headers) as response:
            assert response.status == 200, await response.text()
    ids = await upload_files(api, user, args.files, args.file_bytes)
    for number, attachment_id in enumerate(ids):
        message = {"message_id": f"f{number}", "body": "photo", "attachments": [attachment_id]}
        async with api.post(f"/v2/conversations/{CID}/messages", json=message, headers=user) as response:
            assert response.status == 200, await response.text()
    return ids


async def copy_baseline(settings: Settings, ids: list[str]) -> float:
    """Every attachment object read in order and written into one multipart upload: seconds."""
    async with open_s3_client(settings) as s3:
        writer = ObjectWriter.in_bucket(s3, settings, key="bench-baseline.bin", content_type="application/zip")
        started = time.perf_counter()
        for attachment_id in ids:
            response = await s3.get_object(
                Bucket=settings.s3_bucket, Key=f"{settings.s3_attachment_prefix}{attachment_id}"
            )
            async with response["Body"] as body:
                async for chunk in body.iter_chunks(1024 * 1024):
                    await writer.write(chunk)
        await writer.finish()
        seconds = time.perf_counter() - started
        await s3.delete_object(Bucket=settings.s3_bucket, Key="bench-baseline.bin")
        return seconds


async def figures(args: Any) -> list[Figure]:
    async with running_system(workers=1) as system:
        settings = system.settings()
        admin = {"Authorization": f"Bearer {mint_token(settings, user_id='root', scopes=['admin'])}"}
        user = {"Authorization": f"Bearer {mint_token(settings, user_id='alice')}"}
        worker_pid = system.group.pids()["worker"]
        async with aiohttp.ClientSession(base_url=system.base_url) as api:
            ids = await fill(api, admin, user, args)
            idle_rss = peak_rss_mb(worker_pid)
            profiler = None
            if args.profile:
                # py-spy (from PyPI) samples the worker while it exports: collapsed stacks for a flame graph.
                profiler = await asyncio.create_subprocess_exec(
                    "py-spy",
                    "record",
                    "--format",
                    "raw",
                    "-r",
                    "200",
                    "-p",
                    str(worker_pid),
                    "-o",
                    args.profile,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
            export_seconds, operation = await export(api, user, cid=CID, body={"format": "jsonl", "media": True})
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                await asyncio.wait_for(profiler.wait(), 60)
        assert operation["state"] == "SUCCEEDED", operation
        rss = peak_rss_mb(worker_pid)
        baseline_seconds = await copy_baseline(system.settings("worker"), ids)
    size_mb = operation["result"]["size_bytes"] / 1e6
    print(f"messages, files              {args.messages:>12,} {args.files:,}")
    print(f"ZIP size                     {size_mb:>12.1f} MB")
    print(f"export, 202 -> SUCCEEDED     {export_seconds:>12.2f} s   ({size_mb / export_seconds:.1f} MB/s)")
    print(f"files copied into one upload {baseline_seconds:>12.2f} s")
    print(f"worker peak RSS              {rss:>12.1f} MB   (before the export: {idle_rss:.1f} MB)")
    name = f"export with media ({args.files:,} files, {size_mb / 1000:.2f} GB), 202 -> SUCCEEDED"
    return [
        Figure(name, export_seconds, "s", baseline_seconds, "the files copied into one multipart upload", "<= 1.2"),
        Figure(
            f"worker peak RSS during it (before it: {idle_rss:.0f} MB)",
            rss,
            "MB",
            target=f"< {WORKER_LIMIT_MB} MB (its limit)",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--files", type=int, default=2_000)
    parser.add_argument("--file-bytes", type=int, default=500_000)
    parser.add_argument("--profile", metavar="FILE", help="sample the worker with py-spy into FILE (collapsed stacks)")
    args = parser.parse_args()
    print_table(asyncio.run(figures(args)))


if __name__ == "__main__":
    main()
