"""The export pipeline in one process: the real API, relay, worker and janitor code on the real
Postgres, RabbitMQ and a moto server, driven over HTTP.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from typing import Any

import aio_pika
import pytest
from aiohttp.test_utils import TestClient, TestServer

from services.api.app import init_app
from services.worker import metrics
from shared.broker import EXPORT_ROUTING_KEY, declare_topology
from tests.support import wait_for
from tests.support.api_calls import (
    Headers,
    expected_file,
    import_lines,
    make_conversation,
    read_all,
    running_pipeline,
    submit,
    wait_terminal,
)


async def test_export_matches_the_read_api_byte_for_byte(
    api: TestClient[Any, Any], auth: Headers, pipeline: None
) -> None:
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    bodies = ["你好", 'say "hi"\n\\', "\u2028\x01\x7f", "emoji 😀", "plain"]
    lines = [{"message_id": f"m-{i}", "sender_id": ["alice", "bob"][i % 2], "body": b} for i, b in enumerate(bodies)]
    await import_lines(api, auth, "c-a", lines)

    response = await submit(api, auth, "alice", "c-a", {"format": "jsonl"}, "key-1")
    assert response.status == 202
    assert response.headers["Cache-Control"] == "no-store"
    location = response.headers["Location"]

    operation = await wait_terminal(api, auth, "alice", location)
    assert operation["state"] == "SUCCEEDED", operation
    replay = await submit(api, auth, "alice", "c-a", {"format": "jsonl"}, "key-1")
    assert replay.status == 202
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert "Retry-After" not in replay.headers  # only while non-terminal (docs/api.md: Operations, Operation)
    download = await api.get(operation["result"]["url"], headers=auth("alice"))
    assert download.status == 200
    content = await download.read()

    expected = expected_file(await read_all(api, auth, "alice", "c-a"))
    assert content == expected
    assert operation["result"]["sha256"] == hashlib.sha256(expected).hexdigest()
    assert operation["result"]["message_count"] == len(bodies)
    assert operation["result"]["size_bytes"] == len(expected)
    assert operation["snapshot"] == {"max_seq": len(bodies)}


async def test_range_boundaries_and_empty_range(api: TestClient[Any, Any], auth: Headers, pipeline: None) -> None:
    await make_conversation(api, auth, "c-r", ["alice"])
    await import_lines(
        api, auth, "c-r", [{"message_id": f"m-{i}", "sender_id": "alice", "body": str(i)} for i in range(1, 11)]
    )
    all_messages = await read_all(api, auth, "alice", "c-r")

    cases = [({"after_seq": 3, "before_seq": 8}, [4, 5, 6, 7]), ({"after_seq": 9}, [10]), ({"after_seq": 10}, [])]
    for number, (bounds, seqs) in enumerate(cases):
        response = await submit(api, auth, "alice", "c-r", {"format": "jsonl", **bounds}, f"range-{number}")
        assert response.status == 202
        operation = await wait_terminal(api, auth, "alice", response.headers["Location"])
        assert operation["state"] == "SUCCEEDED"
        content = await (await api.get(operation["result"]["url"], headers=auth("alice"))).read()
        assert content == expected_file([m for m in all_messages if m["seq"] in seqs])
        assert operation["result"]["message_count"] == len(seqs)


async def test_a_result_lost_from_storage_is_a_clean_500_problem(
    api: TestClient[Any, Any], auth: Headers, pipeline: None, s3: Any, settings: Any
) -> None:
    await make_conversation(api, auth, "c-lost", ["alice"])
    await import_lines(api, auth, "c-lost", [{"message_id": "m1", "sender_id": "alice", "body": "x"}])
    response = await submit(api, auth, "alice", "c-lost", {"format": "jsonl"}, "lost-1")
    operation = await wait_terminal(api, auth, "alice", response.headers["Location"])
    assert operation["state"] == "SUCCEEDED"
    listed = await s3.list_objects_v2(Bucket=settings.s3_bucket, Prefix=settings.s3_prefix)
    for item in listed["Contents"]:
        await s3.delete_object(Bucket=settings.s3_bucket, Key=item["Key"])

    download = await api.get(operation["result"]["url"], headers=auth("alice"))
    assert download.status == 500
    assert "Retry-After" not in download.headers  # retrying cannot bring a lost object back
    body = await download.json()
    assert body["code"] == "INTERNAL"
    assert body["detail"] == "The result file is missing from storage; it cannot be downloaded."


async def test_stalled_downloads_are_capped_and_cut_off(
    api: TestClient[Any, Any], auth: Headers, pipeline: None, settings: Any
) -> None:
    await make_conversation(api, auth, "c-slow", ["alice"])
    body = "x" * 60_000
    await import_lines(
        api, auth, "c-slow", [{"message_id": f"m{n}", "sender_id": "alice", "body": body} for n in range(300)]
    )
    response = await submit(api, auth, "alice", "c-slow", {"format": "jsonl"}, "slow-1")
    operation = await wait_terminal(api, auth, "alice", response.headers["Location"])
    assert operation["result"]["size_bytes"] > 16_000_000  # far more than socket buffers hold

    strict = settings.model_copy(update={"download_concurrency": 1, "download_write_timeout_seconds": 1.0})
    async with TestClient(TestServer(init_app(strict))) as capped:
        # A client that asks for the file and never reads it.
        reader, writer = await asyncio.open_connection(capped.host, capped.port)
        try:
            token = auth("alice")["Authorization"]
            request = f"GET {operation['result']['url']} HTTP/1.1\r\nHost: x\r\nAuthorization: {token}\r\n\r\n"
            writer.write(request.encode())
            await writer.drain()
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")

            busy = await capped.get(operation["result"]["url"], headers=auth("alice"))
            assert busy.status == 503
            assert busy.headers["Retry-After"] == "5"

            async def served() -> bool:
                headers = {**auth("alice"), "Range": "bytes=0-9"}
                attempt = await capped.get(operation["result"]["url"], headers=headers)
                return attempt.status == 206 and await attempt.read() == b'{"conversa'

            assert await wait_for(served, timeout=30)
        finally:
            writer.close()


async def test_a_worker_with_one_slot_works_through_a_backlog(
    api: TestClient[Any, Any], auth: Headers, settings: Any, s3: Any
) -> None:
    await make_conversation(api, auth, "c-backlog", ["alice"])
    await import_lines(api, auth, "c-backlog", [{"message_id": "m1", "sender_id": "alice", "body": "x"}])
    locations = []
    for number in range(4):
        response = await submit(api, auth, "alice", "c-backlog", {"format": "jsonl"}, f"backlog-{number}")
        locations.append(response.headers["Location"])

    # One slot: the consumer pauses after each delivery and must resume for the next one.
    async with running_pipeline(settings.model_copy(update={"worker_concurrency": 1})):
        for location in locations:
            assert (await wait_terminal(api, auth, "alice", location))["state"] == "SUCCEEDED"


async def test_undecodable_wake_ups_are_dead_lettered_and_work_goes_on(
    api: TestClient[Any, Any], auth: Headers, pipeline: None, settings: Any
) -> None:
    junk = [b"[" * 100_000 + b"]" * 100_000, b"not json", b'{"operation_id": "op\\u0000x"}', b"{}", b"\xff"]
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        exchange, *_ = await declare_topology(channel, settings)  # the pipeline may not have declared it yet
        for body in junk * 3:  # more than all the worker's slots
            await exchange.publish(aio_pika.Message(body=body), routing_key=EXPORT_ROUTING_KEY)

        await make_conversation(api, auth, "c-junk", ["alice"])
        response = await submit(api, auth, "alice", "c-junk", {"format": "jsonl"}, "after-junk")
        assert (await wait_terminal(api, auth, "alice", response.headers["Location"]))["state"] == "SUCCEEDED"

        dead = await channel.declare_queue(f"{settings.amqp_queue}.dead", passive=True)

        async def all_dead_lettered() -> bool:
            declared = await channel.declare_queue(dead.name, passive=True)
            return declared.declaration_result.message_count == len(junk) * 3

        assert await wait_for(all_dead_lettered, timeout=20)


async def test_a_wake_up_for_an_unknown_operation_is_acked_logged_and_counted(
    api: TestClient[Any, Any], auth: Headers, pipeline: None, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    unknown = "op_NeverHandedOut0000000000"
    counted = metrics.UNKNOWN_WAKEUPS._value.get()
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        exchange, *_ = await declare_topology(channel, settings)
        with caplog.at_level(logging.WARNING, logger="services.worker.queue.consumer"):
            body = json.dumps({"operation_id": unknown}).encode()
            await exchange.publish(aio_pika.Message(body=body), routing_key=EXPORT_ROUTING_KEY)

            def logged() -> bool:
                return any(getattr(record, "operation_id", None) == unknown for record in caplog.records)

            assert await wait_for(logged, timeout=20)
        assert metrics.UNKNOWN_WAKEUPS._value.get() == counted + 1
        queue = await channel.declare_queue(settings.amqp_queue, passive=True)
        assert queue.declaration_result.message_count == 0
        dead = await channel.declare_queue(f"{settings.amqp_queue}.dead", passive=True)
        assert dead.declaration_result.message_count == 0
