"""RabbitMQ and PostgreSQL restarted under running exports (docs/states.md: States and failure model): every part
reconnects by itself, consumers come back, and every export finishes. Each test restarts a private server of its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import pytest

from devtools.servers import PrivatePostgres, PrivateRabbitMQ
from shared.storage import MIN_UPLOAD_BYTES_PER_SECOND
from tests.support import AMQP_URL, cloned_database, wait_for
from tests.support.fault_harness import (
    SLOW_UPLOADS,
    UPLOAD_BYTES_PER_SECOND,
    Faulty,
    check_ended_correctly,
    make_conversation,
    running,
    uploading,
    wait_for_queue_counts,
)

pytestmark = pytest.mark.e2e

EXPORTS = 4


async def ready_status(faulty: Faulty) -> int:
    response = await faulty.http.get("/readyz")
    return response.status


async def submit_several(faulty: Faulty, first: int) -> list[str]:
    return [await faulty.submit("alice", "c-mid", f"restart-{number}") for number in range(first, first + EXPORTS)]


async def test_exports_finish_across_a_rabbitmq_restart(
    private_rabbitmq: PrivateRabbitMQ, template_db: str, tmp_path: Path
) -> None:
    async with (
        cloned_database(template_db, "chatexport_f") as database_url,
        running(tmp_path, database_url=database_url, amqp_url=private_rabbitmq.url) as f,
    ):
        await make_conversation(f, "c-mid", ["alice"], messages=5000, body_bytes=200)
        fingerprint = await f.messages_fingerprint()
        expected = await f.expected("alice", "c-mid")
        before = await submit_several(f, 0)

        await asyncio.to_thread(private_rabbitmq.stop)
        # Submissions go on while the broker is down: the outbox keeps them.
        during = await submit_several(f, EXPORTS)
        await asyncio.to_thread(private_rabbitmq.start)
        # Both workers register their consumers again by themselves.
        await wait_for(lambda: _consumers_are(f, 2), timeout=60)
        after = await submit_several(f, 2 * EXPORTS)

        outcomes: dict[str, bytes | str] = dict.fromkeys(before + during + after, expected)
        await check_ended_correctly(f, "alice", outcomes, fingerprint=fingerprint)


async def test_exports_finish_across_a_postgres_restart(
    private_postgres: PrivatePostgres, private_database_url: str, tmp_path: Path
) -> None:
    database_url = private_database_url
    async with running(tmp_path, database_url=database_url, amqp_url=AMQP_URL, overrides=SLOW_UPLOADS) as f:
        await make_conversation(f, "c-mid", ["alice"], messages=40_000, body_bytes=300)
        fingerprint = await f.messages_fingerprint()
        expected = await f.expected("alice", "c-mid")
        f.proxy.throttle(UPLOAD_BYTES_PER_SECOND)
        exports = await submit_several(f, 0)
        await uploading(f, exports[0])

        await f.pool.expire_connections()
        await asyncio.to_thread(private_postgres.stop, "fast")
        assert await wait_for(lambda: _status_is(f, 503), timeout=30)
        refused = await f.http.post(
            "/v3/conversations/c-mid/exports",
            json={"format": "jsonl"},
            headers={**f.auth("alice"), "Idempotency-Key": "while-down"},
        )
        assert refused.status == 503
        assert (await refused.json())["code"] == "SERVICE_UNAVAILABLE"
        await asyncio.to_thread(private_postgres.start)
        assert await wait_for(lambda: _status_is(f, 200), timeout=60)
        f.proxy.throttle(None)

        exports += await submit_several(f, EXPORTS)
        outcomes: dict[str, bytes | str] = dict.fromkeys(exports, expected)
        await check_ended_correctly(f, "alice", outcomes, fingerprint=fingerprint)


async def test_the_worker_acks_before_the_export_finishes(
    private_rabbitmq: PrivateRabbitMQ, template_db: str, tmp_path: Path
) -> None:
    async with (
        cloned_database(template_db, "chatexport_f") as database_url,
        running(tmp_path, database_url=database_url, amqp_url=private_rabbitmq.url, overrides=SLOW_UPLOADS) as f,
    ):
        await make_conversation(f, "c-mid", ["alice"], messages=40_000, body_bytes=300)
        fingerprint = await f.messages_fingerprint()
        expected = await f.expected("alice", "c-mid")
        f.proxy.throttle(UPLOAD_BYTES_PER_SECOND)
        operation_id = await f.submit("alice", "c-mid", "ack-1")

        await uploading(f, operation_id)
        # At twice the slowest rate an upload's deadline allows, the rest of the file takes about 30 s to send:
        # far longer than the broker's figures, which lag a little behind the ack and come from a command line
        # tool that is slow on a loaded machine, take to show it.
        f.proxy.throttle(2 * MIN_UPLOAD_BYTES_PER_SECOND)
        await wait_for_queue_counts(private_rabbitmq, f.settings.amqp_queue, ready=0, unacked=0)
        assert (await f.operation(operation_id))["state"] == "RUNNING"
        f.proxy.throttle(None)
        await check_ended_correctly(f, "alice", {operation_id: expected}, fingerprint=fingerprint)


async def _consumers_are(faulty: Faulty, expected: int) -> bool:
    try:
        connection = await aio_pika.connect(faulty.settings.amqp_url)
    except (aio_pika.exceptions.AMQPConnectionError, OSError):
        return False
    async with connection:
        queue = await (await connection.channel()).declare_queue(faulty.settings.amqp_queue, passive=True)
        return bool(queue.declaration_result.consumer_count == expected)


async def _status_is(faulty: Faulty, status: int) -> bool:
    try:
        return await ready_status(faulty) == status
    except OSError:
        return False
