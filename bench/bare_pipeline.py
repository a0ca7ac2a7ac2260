"""The baseline of the drain benchmark: the product's pipeline done with the least code, as processes of its
own on the same servers (docs/benchmark.md: Benchmark, Bare pipeline).

- ``api``: ``POST /v3/conversations/{cid}/exports`` writes the operation, its idempotency row and its outbox
  row with a NOTIFY in one statement (one transaction, one round trip) and answers 202 with the operation's id;
- ``relay``: claims up to 100 outbox rows with ``SKIP LOCKED``, publishes each with a publisher confirm and
  marks them published in the claim's transaction; it waits for the NOTIFY (or a second) when none is left;
- ``worker``: consumes with a prefetch of 4, claims the operation with one conditional UPDATE, acks, COPYs
  the conversation's messages out as JSON lines, writes them with one PutObject and marks the operation
  SUCCEEDED with one UPDATE.

No authentication, validation, quota, lease, fencing generation, retry, progress or callback. Its tables
(``SCHEMA``) live in a database of its own, its queue is a quorum queue like the product's. Each process
prints ``ready`` once it serves; ``bench/bare_system.py`` starts them.

    .venv/bin/python -m bench.bare_pipeline api|relay|worker    (settings: the BARE_* environment variables)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aio_pika
import asyncpg
from aiobotocore.session import get_session
from aiohttp import web

SCHEMA = """
CREATE TABLE operations (
    operation_id text PRIMARY KEY,
    owner_id text NOT NULL,
    conversation_id text NOT NULL,
    state text NOT NULL DEFAULT 'QUEUED',
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE TABLE idempotency_keys (
    owner_id text,
    idempotency_key text,
    operation_id text NOT NULL,
    PRIMARY KEY (owner_id, idempotency_key)
);
CREATE TABLE outbox (outbox_id bigserial PRIMARY KEY, operation_id text NOT NULL, published_at timestamptz);
CREATE INDEX outbox_unpublished ON outbox (outbox_id) WHERE published_at IS NULL;
CREATE TABLE messages (
    conversation_id text,
    seq bigint,
    message_id text NOT NULL,
    sender_id text NOT NULL,
    body text NOT NULL,
    sent_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, seq)
);
"""
CHANNEL = "bare_outbox"
SUBMIT = """
WITH operation AS (
    INSERT INTO operations (operation_id, owner_id, conversation_id) VALUES ($1, $2, $3) RETURNING operation_id
), idempotency AS (
    INSERT INTO idempotency_keys SELECT $2, $4, operation_id FROM operation
), outbox AS (
    INSERT INTO outbox (operation_id) SELECT operation_id FROM operation
)
SELECT pg_notify('bare_outbox', '')
"""
CLAIM_OUTBOX = """
SELECT outbox_id, operation_id FROM outbox WHERE published_at IS NULL ORDER BY outbox_id LIMIT 100
FOR UPDATE SKIP LOCKED
"""
# The worker's claim and its SUCCEEDED commit, one statement each (``bench/claim_cost.py`` runs them too).
CLAIM = "UPDATE operations SET state = 'RUNNING' WHERE operation_id = $1 AND state = 'QUEUED' RETURNING conversation_id"
SUCCEED = "UPDATE operations SET state = 'SUCCEEDED', finished_at = now() WHERE operation_id = $1"
MESSAGES_AS_JSON_LINES = """
SELECT json_build_object('message_id', message_id, 'sender_id', sender_id, 'body', body, 'sent_at', sent_at)
FROM messages WHERE conversation_id = $1 ORDER BY seq
"""
IDLE_WAIT_SECONDS = 1.0
PREFETCH = 4
READY = "ready"
POOL = web.AppKey("pool", asyncpg.Pool)


def setting(name: str) -> str:
    """The process's ``BARE_<name>`` environment variable; raises ``KeyError`` when unset."""
    return os.environ[f"BARE_{name}"]


async def no_reset(conn: asyncpg.Connection) -> None:
    """Nothing: as lean as the product's pools, which keep no session state to reset on release."""


async def submit(request: web.Request) -> web.Response:
    """``POST /v3/conversations/{cid}/exports``: a new operation; the caller's ``Authorization`` names it."""
    operation_id = f"op_{uuid.uuid4().hex}"
    await request.app[POOL].execute(
        SUBMIT,
        operation_id,
        request.headers.get("Authorization", ""),
        request.match_info["cid"],
        request.headers["Idempotency-Key"],
    )
    location = {"Location": f"/v3/operations/{operation_id}"}
    return web.json_response({"operation_id": operation_id}, status=202, headers=location)


async def _pool(app: web.Application) -> AsyncIterator[None]:
    app[POOL] = await asyncpg.create_pool(setting("DATABASE_URL"), min_size=4, max_size=10, reset=no_reset)
    print(READY, flush=True)
    yield
    await app[POOL].close()


def api() -> None:
    """Serve the submit on ``BARE_PORT`` until stopped."""
    app = web.Application()
    app.cleanup_ctx.append(_pool)
    app.router.add_post("/v3/conversations/{cid}/exports", submit)
    web.run_app(app, host="127.0.0.1", port=int(setting("PORT")), access_log=None, print=None)


async def relay() -> None:
    """Publish the outbox to ``BARE_QUEUE`` until stopped."""
    conn = await asyncpg.connect(setting("DATABASE_URL"))
    woken = asyncio.Event()
    await conn.add_listener(CHANNEL, lambda *_: woken.set())
    broker = await aio_pika.connect(setting("AMQP_URL"))
    channel = await broker.channel(publisher_confirms=True)
    print(READY, flush=True)
    while True:
        woken.clear()
        async with conn.transaction():
            rows = await conn.fetch(CLAIM_OUTBOX)
            await asyncio.gather(*(_publish(channel, row["operation_id"]) for row in rows))
            await conn.execute(
                "UPDATE outbox SET published_at = now() WHERE outbox_id = ANY($1)", [row["outbox_id"] for row in rows]
            )
        if not rows:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), IDLE_WAIT_SECONDS)


async def _publish(channel: aio_pika.abc.AbstractChannel, operation_id: str) -> None:
    message = aio_pika.Message(operation_id.encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
    await channel.default_exchange.publish(message, routing_key=setting("QUEUE"))


async def worker() -> None:
    """Run the operations ``BARE_QUEUE`` names until stopped."""
    pool = await asyncpg.create_pool(setting("DATABASE_URL"), min_size=1, max_size=PREFETCH, reset=no_reset)
    async with storage(os.environ) as s3:
        broker = await aio_pika.connect(setting("AMQP_URL"))
        channel = await broker.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        queue = await channel.get_queue(setting("QUEUE"))

        async def run(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            operation_id = message.body.decode()
            async with pool.acquire() as conn:
                cid = await conn.fetchval(CLAIM, operation_id)
                await message.ack()
                if cid is None:
                    return
                lines: list[bytes] = []
                await conn.copy_from_query(MESSAGES_AS_JSON_LINES, cid, output=_appender(lines))
                await s3.put_object(Bucket=setting("BUCKET"), Key=f"{operation_id}.jsonl", Body=b"".join(lines))
                await conn.execute(SUCCEED, operation_id)

        await queue.consume(run)
        print(READY, flush=True)
        await asyncio.Future()


def storage(environment: Mapping[str, str]) -> Any:
    """An S3 client for the ``BARE_S3_*`` settings in ``environment``, to enter with ``async with``."""
    return get_session().create_client(
        "s3",
        endpoint_url=environment["BARE_S3_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=environment["BARE_S3_ACCESS_KEY_ID"],
        aws_secret_access_key=environment["BARE_S3_SECRET_ACCESS_KEY"],
    )


def _appender(lines: list[bytes]) -> Callable[[bytes], Awaitable[None]]:
    # A coroutine function: asyncpg hands a file-like output's writes to a thread.
    async def append(data: bytes) -> None:
        lines.append(data)

    return append


ROLES: dict[str, Callable[[], None]] = {
    "api": api,
    "relay": lambda: asyncio.run(relay()),
    "worker": lambda: asyncio.run(worker()),
}

if __name__ == "__main__":
    ROLES[sys.argv[1]]()
