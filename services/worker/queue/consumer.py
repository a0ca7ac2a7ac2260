"""Consuming one queue's wake-up messages, whatever work they name: at most a number at once, each handed to
its ``Deliveries`` (the operation's in ``services.worker.operation.deliveries``, a chunk's in
``services.worker.chunked.chunk``), which claims the lease in Postgres, acks, then works in the background.

The ack follows the lease commit at once (docs/architecture.md: How it works), so a long export never sits unacked
against the broker's consumer timeout; if the worker dies after the ack, the lease expires and the janitor re-enqueues.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Generic, Protocol, TypeVar

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from services.worker import metrics
from shared.db import TRANSIENT_DATABASE_ERRORS
from shared.lease import hand_back_to_the_end
from shared.lifecycle import outlast_cancels
from shared.payloads import message_version, readable

log = logging.getLogger(__name__)
Key = TypeVar("Key")
T = TypeVar("T")

# Pause before handing a delivery back when the database is unreachable, so the queue does not spin.
DATABASE_RETRY_SECONDS = 2.0
# Retrying to consume after a channel failed under us: 1 s doubling to 30 s, like the start-up retries.
RESUME_RETRY_SECONDS = 1.0
RESUME_RETRY_MAX_SECONDS = 30.0
# How long every slot must stay busy, with no work ending, before the consumer is cancelled (``Consumer``).
PAUSE_AFTER_SECONDS = 0.2
# A stop waits this long for the broker to take the consumer's cancel; beyond it the connection's close
# ends the consumer anyway, and the drain of running exports must not wait behind a dead broker.
STOP_TIMEOUT_SECONDS = 5.0
# What a channel operation raises when the broker or the channel went away.
BROKER_ERRORS: tuple[type[BaseException], ...] = (
    aio_pika.exceptions.AMQPError,
    aio_pika.exceptions.ChannelInvalidStateError,
    ConnectionError,
)


class Deliveries(Protocol[Key]):
    """What one queue's deliveries mean: ``decode`` a body into the work it names (None: undecodable, the
    message is dead-lettered), and ``handle`` it, settling the message (``settle``) once its lease is
    claimed or refused. ``what`` names the work in log lines and task names.
    """

    what: str

    def decode(self, body: bytes) -> Key | None: ...

    async def handle(self, message: AbstractIncomingMessage, key: Key) -> None: ...


class Consumer(Generic[Key]):
    """Turns deliveries of ``queue`` into leases through ``deliveries``; at most ``concurrency`` run at once.

    Because a delivery is acked as soon as its lease commits, the broker's prefetch does not bound the
    work in progress; it bounds the deliveries that wait here for a slot. Flow control bounds the rest:
    when every slot stays busy for ``pause_after_seconds`` with no work ending, the consumer is cancelled (the
    broker sends nothing more, so a wake-up published meanwhile goes to a worker with a free slot instead of
    waiting behind long exports here), and it consumes again as soon as a slot frees. While work keeps
    ending (a backlog of small exports) the consumer stays: a cancel and a consume for every few exports
    add broker round trips that keep no wake-up from waiting, since each slot frees within milliseconds
    (docs/benchmark.md: The consumer stays while work ends).
    """

    def __init__(
        self,
        *,
        queue: AbstractQueue,
        deliveries: Deliveries[Key],
        concurrency: int,
        pause_after_seconds: float = PAUSE_AFTER_SECONDS,
    ) -> None:
        self._queue = queue
        self._deliveries = deliveries
        self._slots = asyncio.Semaphore(concurrency)
        self._pause_after_seconds = pause_after_seconds
        self._flow = asyncio.Lock()
        self._consumer_tag: str | None = None
        self._closing = False
        self._flow_tasks: set[asyncio.Task[None]] = set()
        # Work ended so far, and whether a pause is waiting to see if any ends within ``pause_after_seconds``.
        self._ended = 0
        self._pause_pending = False
        self.running: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Begin consuming, in the background: while the broker is down this waits and retries, and a stop
        must still be able to end it.
        """
        self._in_background(self._resume())

    @property
    def registered(self) -> bool:
        """Ready to take work (docs/architecture.md: How it works): consuming, or paused only because every slot is
        busy."""
        return not self._closing and (self._consumer_tag is not None or self._slots.locked())

    def close_intake(self) -> None:
        """Start no more work: from now on ``running`` gains no task, and a delivery goes back to the queue."""
        self._closing = True
        for task in self._flow_tasks:
            task.cancel()

    async def stop(self) -> None:
        """Stop taking work (``close_intake``) and cancel the consumer; deliveries still arriving go back to the
        queue.

        Bounded by ``STOP_TIMEOUT_SECONDS``: while the broker is unreachable a channel operation waits for
        the reconnect, and a stop must not; the connection's close then ends the consumer anyway.
        """
        self.close_intake()
        with contextlib.suppress(TimeoutError, *BROKER_ERRORS):
            async with asyncio.timeout(STOP_TIMEOUT_SECONDS), self._flow:
                if self._consumer_tag is not None:
                    tag, self._consumer_tag = self._consumer_tag, None
                    await self._queue.cancel(tag)

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        """Handle one delivery; every path acks, rejects or requeues it."""
        version = message_version(message.headers)
        if not readable(version):
            # Another worker may read it (a newer release beside this one); the queue counts the returns
            # and dead-letters it past its delivery limit (docs/deploy.md: Upgrading, Payload versions).
            metrics.MESSAGES_PUT_BACK.inc()
            log.warning("message of an unknown payload version put back", extra={"payload_version": version})
            await settle(message, requeue=True)
            return
        key = self._deliveries.decode(message.body)
        if key is None:
            log.error("undecodable message dead-lettered", extra={"message_id": message.message_id})
            await message.reject(requeue=False)
            return
        # Only deliveries already prefetched when the slots filled up wait here, and only for a slot.
        await self._slots.acquire()
        if self._closing:
            self._slots.release()
            await settle(message, requeue=True)
            return
        what = self._deliveries.what
        task = asyncio.create_task(self._deliveries.handle(message, key), name=f"{what}-{key}")
        self.running.add(task)
        task.add_done_callback(self._finished)
        if self._slots.locked() and not self._pause_pending:
            self._pause_pending = True
            self._in_background(self._pause_while_busy())

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        self._ended += 1
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("task failed", exc_info=task.exception(), extra={"task": task.get_name()})
        if not self._closing:
            self._in_background(self._resume())

    def _in_background(self, flow: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(flow, name="consumer-flow")
        self._flow_tasks.add(task)
        task.add_done_callback(self._flow_tasks.discard)

    async def _pause_while_busy(self) -> None:
        """Cancel the consumer once every slot has stayed busy for ``pause_after_seconds`` with no work
        ending; return as soon as a slot is free."""
        try:
            while self._slots.locked() and not self._closing:
                ended = self._ended
                await asyncio.sleep(self._pause_after_seconds)
                async with self._flow:
                    if self._consumer_tag is not None and self._slots.locked() and self._ended == ended:
                        tag, self._consumer_tag = self._consumer_tag, None
                        await self._queue.cancel(tag)
                        metrics.CONSUMER_PAUSES.labels(self._deliveries.what).inc()
                        log.debug("all slots busy; consumer paused", extra={"queue": self._queue.name})
                        return
        finally:
            self._pause_pending = False

    async def _resume(self) -> None:
        # A robust channel waits for the reconnect by itself; a channel closed under us raises, and then
        # consuming is tried again, or this worker would stay paused for good.
        delay = RESUME_RETRY_SECONDS
        while not self._closing:
            try:
                async with self._flow:
                    if self._consumer_tag is None and not self._closing and not self._slots.locked():
                        self._consumer_tag = await self._queue.consume(self.on_message)
                return
            except BROKER_ERRORS as exc:
                log.warning(
                    "could not start consuming; will retry", extra={"error": type(exc).__name__, "in_seconds": delay}
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RESUME_RETRY_MAX_SECONDS)


class NotClaimed(Exception):
    """The database could not be reached for a claim: the delivery went back to its queue."""


async def claim_or_requeue(
    message: AbstractIncomingMessage,
    claim: Callable[[], Awaitable[T | None]],
    *,
    hand_back: Callable[[T], Awaitable[None]],
    log_extra: Mapping[str, Any],
) -> T | None:
    """Run ``claim`` (one transaction that takes a lease; None when it took nothing) and ack ``message`` once
    it committed; return what it claimed. When the database cannot be reached the message goes back to its
    queue after ``DATABASE_RETRY_SECONDS``, so that the queue does not spin, and ``NotClaimed`` is raised.

    A shutdown that comes while the claim or the ack is in flight waits for them and gives what the claim
    took to ``hand_back`` before ``CancelledError`` goes on: a lease committed at that moment would otherwise
    be held by nobody until it expires (docs/kubernetes.md: Stopping and scaling down).
    """
    taking = asyncio.ensure_future(_claim_and_settle(message, claim, log_extra))
    try:
        return await asyncio.shield(taking)
    except asyncio.CancelledError:
        await outlast_cancels(taking)
        failed = taking.cancelled() or taking.exception() is not None
        if not failed and (claimed := taking.result()) is not None:
            await hand_back_to_the_end(lambda: hand_back(claimed), log_extra=log_extra)
        raise


async def _claim_and_settle(
    message: AbstractIncomingMessage, claim: Callable[[], Awaitable[T | None]], log_extra: Mapping[str, Any]
) -> T | None:
    try:
        claimed = await claim()
    except TRANSIENT_DATABASE_ERRORS as exc:
        log.warning("claim failed; message requeued", extra=dict(log_extra))
        await asyncio.sleep(DATABASE_RETRY_SECONDS)
        await settle(message, requeue=True)
        raise NotClaimed from exc
    await settle(message, requeue=False)
    return claimed


async def settle(message: AbstractIncomingMessage, *, requeue: bool) -> None:
    """Ack ``message``, or hand it back to its queue when ``requeue``; a failure is no error: after a
    reconnect the delivery tag belongs to a dead channel, the broker redelivers the message, and the lease
    makes the redelivery a no-op.
    """
    with contextlib.suppress(Exception):
        if requeue:
            await message.nack(requeue=True)
        else:
            await message.ack()


def decode_payload(body: bytes) -> dict[str, Any] | None:
    """A wake-up's JSON object, or None for a body that is not one."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return payload if isinstance(payload, dict) else None
