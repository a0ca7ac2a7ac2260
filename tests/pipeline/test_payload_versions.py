"""Payload versions (docs/deploy.md: Upgrading, Payload versions): a wake-up or an outbox row of a version this
release does not read is put back, then dead-lettered after the delivery limit and counted; one of the
previous release's version is handled.
"""

from __future__ import annotations

import json
from typing import Any

import aio_pika
import asyncpg

from services.relay import metrics as relay_metrics
from services.worker import metrics as worker_metrics
from shared.broker import EXPORT_ROUTING_KEY, declare_topology
from shared.payloads import PAYLOAD_VERSION_HEADER
from shared.settings import Settings
from tests.support import wait_for
from tests.support.api_calls import running_pipeline

DELIVERY_LIMIT = 2
UNKNOWN_VERSION = 99


async def test_a_wake_up_of_an_unknown_version_is_put_back_then_dead_lettered_and_an_unversioned_one_is_read(
    settings: Settings, s3: Any
) -> None:
    limited = settings.model_copy(update={"amqp_delivery_limit": DELIVERY_LIMIT})
    put_back, unknown = worker_metrics.MESSAGES_PUT_BACK._value.get(), worker_metrics.UNKNOWN_WAKEUPS._value.get()
    body = json.dumps({"operation_id": "op_NeverHandedOut0000000000"}).encode()
    async with running_pipeline(limited), await aio_pika.connect(limited.amqp_url) as connection:
        channel = await connection.channel()
        exchange, *_ = await declare_topology(channel, limited)
        newer = aio_pika.Message(body=body, headers={PAYLOAD_VERSION_HEADER: UNKNOWN_VERSION})
        await exchange.publish(newer, routing_key=EXPORT_ROUTING_KEY)

        async def dead_lettered() -> bool:
            dead = await channel.declare_queue(f"{limited.amqp_queue}.dead", passive=True)
            return dead.declaration_result.message_count == 1

        assert await wait_for(dead_lettered, timeout=20)
        # Put back on every delivery up to the limit, never decoded: no unknown operation was looked up.
        assert worker_metrics.MESSAGES_PUT_BACK._value.get() - put_back >= DELIVERY_LIMIT
        assert worker_metrics.UNKNOWN_WAKEUPS._value.get() == unknown

        # The previous release's relay sets no version: its wake-up is version 1 and is read.
        await exchange.publish(aio_pika.Message(body=body), routing_key=EXPORT_ROUTING_KEY)
        assert await wait_for(lambda: worker_metrics.UNKNOWN_WAKEUPS._value.get() == unknown + 1, timeout=20)


async def test_an_outbox_row_of_an_unknown_version_is_put_back_then_dead_lettered_and_a_previous_one_is_published(
    settings: Settings, s3: Any, pool: asyncpg.Pool
) -> None:
    limited = settings.model_copy(update={"amqp_delivery_limit": DELIVERY_LIMIT})
    put_back, dead = relay_metrics.OUTBOX_PUT_BACK._value.get(), relay_metrics.OUTBOX_DEAD_LETTERED._value.get()
    payload = json.dumps({"operation_id": "op_NeverHandedOut0000000000"})
    newer = await pool.fetchval(
        "INSERT INTO outbox (operation_id, routing_key, payload, payload_version) VALUES ($1, $2, $3, $4)"
        " RETURNING outbox_id",
        "op_NeverHandedOut0000000000",
        EXPORT_ROUTING_KEY,
        payload,
        UNKNOWN_VERSION,
    )
    # As the previous release writes it: no version column.
    previous = await pool.fetchval(
        "INSERT INTO outbox (operation_id, routing_key, payload) VALUES ($1, $2, $3) RETURNING outbox_id",
        "op_NeverHandedOut0000000000",
        EXPORT_ROUTING_KEY,
        payload,
    )
    async with running_pipeline(limited):

        async def ended() -> bool:
            return bool(
                await pool.fetchval("SELECT dead_lettered_at IS NOT NULL FROM outbox WHERE outbox_id = $1", newer)
            )

        assert await wait_for(ended, timeout=30)
    row = await pool.fetchrow("SELECT * FROM outbox WHERE outbox_id = $1", newer)
    assert (row["published_at"], row["publish_attempts"]) == (None, DELIVERY_LIMIT)
    assert row["not_before"] == await pool.fetchval("SELECT 'infinity'::timestamptz")
    assert relay_metrics.OUTBOX_PUT_BACK._value.get() - put_back == DELIVERY_LIMIT - 1
    assert relay_metrics.OUTBOX_DEAD_LETTERED._value.get() - dead == 1
    assert await pool.fetchval("SELECT published_at IS NOT NULL FROM outbox WHERE outbox_id = $1", previous)
