"""Publishing outbox rows (docs/architecture.md: How it works).

A batch of due rows is locked with SKIP LOCKED, published with publisher confirms, ``mandatory`` and a
timeout, and marked published in the same transaction only for the rows the broker confirmed. A crash
between confirm and mark publishes a row twice; that is harmless because a message is only a wake-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import aio_pika
import asyncpg
from aio_pika.abc import AbstractChannel, AbstractExchange

from services.relay import metrics
from shared import tracing
from shared.db import TRANSIENT_DATABASE_ERRORS, close_connection, connect
from shared.lifecycle import first_set
from shared.payloads import PAYLOAD_VERSION_HEADER, readable
from shared.repository import outbox
from shared.settings import RelayPartSettings

log = logging.getLogger(__name__)

FAILED_PUBLISH_RETRY_SECONDS = 5.0
NOTIFY_CHANNEL = "chatexport_outbox"
MIN_WAIT_SECONDS = 0.05


@dataclass(frozen=True)
class Batch:
    """What one claim, or a round of them, did: ``handled`` rows (published, held back or put back) and
    ``next_due_seconds`` until the next row is due (``outbox.Claim``), the held-back rows included.
    """

    handled: int
    next_due_seconds: float | None


class Relay:
    """Moves due outbox rows to ``exchange``, declared on the robust ``channel``; several relays may run side by
    side.
    """

    def __init__(
        self, *, pool: asyncpg.Pool, channel: AbstractChannel, exchange: AbstractExchange, settings: RelayPartSettings
    ) -> None:
        self._pool = pool
        self._channel = channel
        self._exchange = exchange
        self._settings = settings
        self._closing: asyncio.Future[Any] | None = None  # the last renewal's close of the channel

    async def publish_due(self) -> Batch:
        """Publish one batch of due rows; return how many rows it handled (0 when none was due) and how long
        until the next row is due.
        """
        started = time.perf_counter()
        batch = await self._publish_batch()
        if batch.handled:  # an empty claim is a poll, not a batch
            metrics.BATCH_DURATION.observe(time.perf_counter() - started)
        return batch

    async def _publish_batch(self) -> Batch:
        async with self._pool.acquire() as conn, conn.transaction():
            claim = await outbox.claim_due(conn, limit=self._settings.relay_batch_size)
            claimed = claim.rows
            if not claimed:
                return Batch(0, claim.next_due_seconds)
            rows: list[outbox.OutboxRow] = []
            unreadable: list[outbox.OutboxRow] = []
            for row in claimed:
                (rows if readable(row.payload_version) else unreadable).append(row)
            if unreadable:
                await self._put_back(conn, unreadable)
            results = await asyncio.gather(*(self._publish(row) for row in rows), return_exceptions=True)
            confirmed = [row.outbox_id for row, error in zip(rows, results, strict=True) if error is None]
            failed = [row.outbox_id for row, error in zip(rows, results, strict=True) if error is not None]
            if confirmed:
                await outbox.mark_published(conn, outbox_ids=confirmed)
            if failed:
                await outbox.mark_failed(conn, outbox_ids=failed, retry_seconds=FAILED_PUBLISH_RETRY_SECONDS)
        metrics.PUBLISHED.inc(len(confirmed))
        log.debug("outbox rows published", extra={"rows": len(confirmed), "held_back": len(failed)})
        if failed:
            log.warning("publish not confirmed; rows held back", extra={"rows": len(failed)})
        if any(isinstance(result, (aio_pika.exceptions.DeliveryError, TimeoutError)) for result in results):
            log.warning("publish refused or not confirmed; renewing the channel")
            await self._renew_channel()
        next_due = claim.next_due_seconds
        if failed or unreadable:  # this batch's own rows held back come due again too
            next_due = min(FAILED_PUBLISH_RETRY_SECONDS, next_due if next_due is not None else math.inf)
        return Batch(len(claimed), next_due)

    async def _put_back(self, conn: asyncpg.Connection, rows: list[outbox.OutboxRow]) -> None:
        """Leave rows of a payload version this release does not read to a relay that reads it
        (docs/deploy.md: Upgrading, Payload versions), dead-lettering those put back too often.
        """
        limit = self._settings.amqp_delivery_limit
        ids = [row.outbox_id for row in rows]
        dead = await outbox.put_back(conn, outbox_ids=ids, retry_seconds=FAILED_PUBLISH_RETRY_SECONDS, limit=limit)
        metrics.OUTBOX_PUT_BACK.inc(len(rows) - dead)
        metrics.OUTBOX_DEAD_LETTERED.inc(dead)
        log.warning(
            "outbox rows of an unknown payload version put back",
            extra={"rows": len(rows), "dead_lettered": dead, "versions": sorted({row.payload_version for row in rows})},
        )

    async def _renew_channel(self) -> None:
        """Close the publishing channel under its robust connection, which opens and declares it anew once the
        broker has answered the close; done after a batch with a publish the broker refused (a nack) or did
        not confirm within ``publish_timeout_seconds``.

        RabbitMQ 3.10 can nack every publish of a channel opened on a surviving node while a quorum queue had
        lost its leader, long after the queue elected another (``tests/clusters/test_broker_failover.py``
        found it: the relay's rows were held back for minutes); a new channel publishes to the new leader.
        A channel whose confirms stopped coming (docs/deploy.md: A frozen node) is renewed the same way. The
        close is waited on for ``publish_timeout_seconds`` at most but never cancelled: aiormq answers a
        cancelled close with a second one, and the broker then refuses the reopened channel and drops the
        connection. Anything that goes wrong here is the next batch's to find.
        """
        if self._closing is not None and not self._closing.done():
            return  # the broker has not answered the last renewal's close yet
        with contextlib.suppress(Exception):
            timeout = self._settings.publish_timeout_seconds
            channel = await asyncio.wait_for(self._channel.get_underlay_channel(), timeout)
            self._closing = asyncio.ensure_future(channel.close())
            self._closing.add_done_callback(_retrieved)
            await asyncio.wait_for(asyncio.shield(self._closing), timeout)

    async def _publish(self, row: outbox.OutboxRow) -> BaseException | None:
        """Publish ``row``'s wake-up and wait for the broker's confirm; None once confirmed, else the error
        (logged and counted).
        """
        message = aio_pika.Message(
            body=row.payload.encode(),
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=str(row.outbox_id),
            headers={PAYLOAD_VERSION_HEADER: row.payload_version},
        )
        try:
            # In the operation's trace: the broker instrumentation puts this span's context in the message's
            # headers, and the worker continues from there (docs/monitoring.md: Monitoring, Traces).
            with tracing.span(
                "outbox publish", parent=row.traceparent, attributes={tracing.OPERATION_ID: row.operation_id}
            ):
                # mandatory: an unroutable message comes back as PublishError instead of vanishing.
                await self._exchange.publish(
                    message,
                    routing_key=row.routing_key,
                    mandatory=True,
                    timeout=self._settings.publish_timeout_seconds,
                )
        except (TimeoutError, aio_pika.exceptions.AMQPError, OSError, RuntimeError) as exc:
            metrics.PUBLISH_FAILURES.labels(_failure_reason(exc)).inc()
            log.warning(
                "publish failed",
                extra={
                    "outbox_id": row.outbox_id,
                    "operation_id": row.operation_id,
                    "error": type(exc).__name__,
                },
            )
            return exc
        return None

    async def run(self, *, stop: asyncio.Event) -> None:
        """Publish until ``stop`` is set; LISTEN/NOTIFY wakes it, polling every ``relay_poll_seconds`` too.

        Rows announced while a round ran (the batches claimed one after another until one is not full) are
        claimed ``relay_linger_seconds`` after that round began, not at once (docs/architecture.md: The outbox):
        under load each batch then carries several rows, and a batch's transaction and round trips cost about
        as much for one row as for ten. A row announced to an idle relay goes out at once.
        """
        wake = asyncio.Event()
        listener: asyncpg.Connection | None = None
        try:
            while not stop.is_set():
                listener = await self._ensure_listener(listener, wake)
                wake.clear()
                round_began = time.monotonic()
                batches = await self._publish_all()
                if batches.handled and wake.is_set():
                    lingered = round_began + self._settings.relay_linger_seconds - time.monotonic()
                    if lingered > 0:
                        await first_set(stop, within_seconds=lingered)
                await self._wait(wake, stop, batches.next_due_seconds)
        finally:
            if listener is not None:
                await close_connection(listener)

    async def _publish_all(self) -> Batch:
        """Publish batches until one is not full; return the round: the rows its batches handled and how long
        until the next row is due (None: none waits, or the database is unavailable, and then the poll interval
        applies and the next batch reports it).
        """
        handled = 0
        try:
            while (batch := await self.publish_due()).handled == self._settings.relay_batch_size:
                handled += batch.handled
        except TRANSIENT_DATABASE_ERRORS as exc:
            log.warning("database unavailable; will retry", extra={"error": type(exc).__name__})
            return Batch(handled, None)
        return Batch(handled + batch.handled, batch.next_due_seconds)

    async def _wait(self, wake: asyncio.Event, stop: asyncio.Event, next_due: float | None) -> None:
        timeout = self._settings.relay_poll_seconds
        if next_due is not None:
            # A due row that another relay holds locked would otherwise make this loop spin.
            timeout = min(timeout, max(next_due, MIN_WAIT_SECONDS))
        await first_set(wake, stop, within_seconds=timeout)

    async def _ensure_listener(
        self, listener: asyncpg.Connection | None, wake: asyncio.Event
    ) -> asyncpg.Connection | None:
        if listener is not None and not listener.is_closed():
            return listener
        listener = None
        try:
            listener = await connect(self._settings)
            await listener.add_listener(NOTIFY_CHANNEL, lambda *_: wake.set())
        except TRANSIENT_DATABASE_ERRORS:
            # A connection that cannot LISTEN (a standby refuses it, 25006; a timeout) is dropped, not kept
            # half set up: the next loop connects again.
            log.warning("LISTEN unavailable; polling only")
            if listener is not None:
                listener.terminate()
            return None
        return listener


def _failure_reason(exc: BaseException) -> str:
    """The ``reason`` label of a failed publish (a bounded set, whatever the driver raises)."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aio_pika.exceptions.DeliveryError):
        return "returned"
    return "broker"


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Take a finished background close's outcome, so that a failed one is not reported as never retrieved."""
    if not future.cancelled():
        future.exception()
