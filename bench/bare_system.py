"""A running bare pipeline (``bench/bare_pipeline.py``), the drain benchmark's baseline, on the benchmark's
Postgres and RabbitMQ and a moto server of its own (docs/benchmark.md: Benchmark, Bare pipeline).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import asyncpg

from bench.bare_pipeline import READY, SCHEMA, storage
from bench.running import AMQP_URL, PG_SERVER, admin_execute
from devtools.localsystem import MOTO_CREDENTIALS
from devtools.moto import MotoServer, start_moto
from devtools.ports import free_port
from devtools.processes import ProcessGroup

READY_TIMEOUT_SECONDS = 60.0
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class BarePipeline:
    """A running bare pipeline: its submit's base URL, its database, its processes and its moto server."""

    base_url: str
    database_url: str
    group: ProcessGroup
    moto: MotoServer


@contextlib.asynccontextmanager
async def pipeline(
    *, workers: int, conversations: Mapping[str, int], env: Mapping[str, str] | None = None
) -> AsyncIterator[BarePipeline]:
    """Start a bare pipeline of one api, one relay and ``workers`` workers, with ``env`` laid over their
    environment, on a fresh database holding ``conversations`` (``{cid: number of messages}``); stop it and
    remove its database, queue and storage on exit. Raises ``TimeoutError`` or ``RuntimeError`` when a
    process does not start.
    """
    tag = uuid.uuid4().hex[:8]
    name = f"chatexport_bench_bare_{tag}"
    database_url = f"{PG_SERVER}/{name}"
    await admin_execute(f'CREATE DATABASE "{name}"')
    moto = start_moto()
    port = free_port("127.0.0.1")
    settings = {
        "BARE_DATABASE_URL": database_url,
        "BARE_AMQP_URL": AMQP_URL,
        "BARE_QUEUE": f"chatexport-bench-bare-{tag}",
        "BARE_S3_ENDPOINT_URL": moto.endpoint_url,
        "BARE_S3_ACCESS_KEY_ID": MOTO_CREDENTIALS["CHATEXPORT_S3_ACCESS_KEY_ID"],
        "BARE_S3_SECRET_ACCESS_KEY": MOTO_CREDENTIALS["CHATEXPORT_S3_SECRET_ACCESS_KEY"],
        "BARE_BUCKET": f"bare-{tag}",
        "BARE_PORT": str(port),
    }
    group = ProcessGroup(log_dir=Path(tempfile.mkdtemp()))
    try:
        await _prepare(settings, conversations)
        parts = ["api", "relay", *(f"worker-{number}" for number in range(workers))]
        for part in parts:
            command = [sys.executable, "-m", "bench.bare_pipeline", part.split("-")[0]]
            group.start(part, command, {**os.environ, **settings, **(env or {})}, cwd=ROOT)
        for part in parts:
            await asyncio.to_thread(group.wait_for_line, part, _is_ready, READY_TIMEOUT_SECONDS)
        yield BarePipeline(f"http://127.0.0.1:{port}", database_url, group, moto)
    finally:
        group.stop_all()
        moto.stop()
        await _delete_queue(settings["BARE_QUEUE"])
        await admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _is_ready(line: str) -> bool:
    return line.strip() == READY


async def _prepare(settings: Mapping[str, str], conversations: Mapping[str, int]) -> None:
    """The schema, the messages, the queue and the bucket."""
    conn = await asyncpg.connect(settings["BARE_DATABASE_URL"])
    try:
        await conn.execute(SCHEMA)
        await conn.executemany(
            "INSERT INTO messages (conversation_id, seq, message_id, sender_id, body) VALUES ($1, $2, $3, $4, $5)",
            [
                (cid, n, f"m{n}", "bare", f"message of the drain {n}")
                for cid, count in conversations.items()
                for n in range(count)
            ],
        )
    finally:
        await conn.close()
    broker = await aio_pika.connect(settings["BARE_AMQP_URL"])
    async with broker:
        channel = await broker.channel()
        await channel.declare_queue(settings["BARE_QUEUE"], durable=True, arguments={"x-queue-type": "quorum"})
    async with storage(settings) as s3:
        await s3.create_bucket(Bucket=settings["BARE_BUCKET"])


async def _delete_queue(name: str) -> None:
    broker = await aio_pika.connect(AMQP_URL)
    async with broker:
        channel = await broker.channel()
        await channel.queue_delete(name)
