"""Waiting for an operation to change without polling: the long poll of ``GET /v3/operations/{id}?wait=N``
and the event stream of ``GET /v3/operations/{id}/events`` (docs/api.md: Operations, Waiting for a change).

Both subscribe to the process's ``OperationChanges`` before they read the operation, so no change can slip
between the read and the wait, and both hold one of the caller's wait slots and are counted in
``WAITING_REQUESTS`` meanwhile (docs/monitoring.md: Monitoring). aiohttp does not cancel a
handler whose client went away: the listener's sweep (``OperationChanges``) wakes a waiter whose connection
is closing, which then gives its slot back. Between wake-ups a waiter sleeps until its deadline or its next
heartbeat, so waiters that nothing wakes cost no CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import asyncpg
from aiohttp import web

from services.api.exporting.changes import CHANGES, Subscription
from services.api.http.keys import PRINCIPAL, SETTINGS, WAIT_SLOTS
from services.api.http.metrics import WAITING_REQUESTS, WaitKind
from services.api.http.middlewares import client_gone
from services.api.http.problems import not_found
from shared.db import TRANSIENT_DATABASE_ERRORS
from shared.ids import is_operation_id
from shared.repository import status_monitor
from shared.repository.operation_view import OperationStamp, OperationView
from shared.representation import is_terminal

log = logging.getLogger(__name__)

T = TypeVar("T")

# An event stream whose read of the operation failed reads again after this.
READ_RETRY_SECONDS = 1.0
# Progress alone is streamed at most this often; a change of state goes out at once.
PROGRESS_INTERVAL_SECONDS = 0.5


@dataclass(frozen=True)
class Reader:
    """Reads one operation as ``owner_id`` may see it: None when it is missing or someone else's (the status
    monitor's authorization, docs/api.md: Operations, Operation). ``key`` names what it reads, so that
    waiters woken together share one read (``OperationChanges.read``).
    """

    pool: asyncpg.Pool
    operation_id: str
    owner_id: str

    @property
    def key(self) -> tuple[str, str]:
        """(operation id, owner id)."""
        return self.operation_id, self.owner_id

    async def __call__(self) -> OperationView | None:
        return await self._read(status_monitor.read_operation)

    async def stamp(self) -> OperationStamp | None:
        """What names the operation's representation (``OperationStamp``); None as for the whole read."""
        return await self._read(status_monitor.read_operation_stamp)

    async def _read(self, read: Callable[..., Awaitable[T | None]]) -> T | None:
        """``read`` of the operation as ``owner_id`` may see it; None without a query for an id that is none."""
        if not is_operation_id(self.operation_id):
            return None
        async with self.pool.acquire() as conn:
            return await read(conn, operation_id=self.operation_id, owner_id=self.owner_id)


@contextlib.asynccontextmanager
async def watching(
    request: web.Request, read: Reader, *, kind: WaitKind
) -> AsyncIterator[tuple[OperationView, Subscription]]:
    """Hold one of the caller's wait slots and a subscription to the operation ``read`` returns for the
    block, counted as a waiting request of ``kind``; yield the operation as read once subscribed, and the
    subscription. Raises ``ProblemError`` 404 when ``read`` finds nothing, and what ``ConnectionSlots.take``
    raises (429 ``TOO_MANY_WAITERS``, 503).
    """
    row = await read_or_404(read)
    with (
        request.app[WAIT_SLOTS].take(request[PRINCIPAL].user_id),
        WAITING_REQUESTS.labels(kind).track_inprogress(),
        request.app[CHANGES].subscribe(row.operation_id, gone=lambda: client_gone(request)) as subscription,
    ):
        yield await read_or_404(read), subscription


async def wait_for_state_change(
    request: web.Request, read: Reader, *, wait_seconds: int, known: Callable[[OperationView], bool] | None = None
) -> OperationView:
    """The operation ``read`` returns, once its state differs from the one it had on arrival, at once when
    that is terminal, else after ``wait_seconds``; progress alone does not end the wait. A conditional poll
    passes ``known``, which tells whether the caller holds a row's version (its ``If-None-Match``): one that
    does not hold the version on arrival is answered at once (docs/api.md: Operations, Conditional
    polls). Raises what ``watching`` raises.
    """
    row = await read_or_404(read)
    if _answer_at_once(row, known):
        return row
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    arrived_in = row.state
    async with watching(request, read, kind="long_poll") as (row, subscription):
        # Read again once subscribed: what changed since the first read is answered now, not at the deadline.
        if _answer_at_once(row, known):
            return row
        while row.state == arrived_in and not subscription.closed and not client_gone(request):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if await subscription.wait(remaining) and _may_have_moved(subscription, arrived_in):
                subscription.missed = False
                row = await _read_shared(request, read, after=subscription.woken_at)
        if row.state == arrived_in and not client_gone(request):
            # The answer at the deadline shows the progress made meanwhile.
            row = await _read_shared(request, read, after=request.app[CHANGES].sequence)
    return row


def _answer_at_once(row: OperationView, known: Callable[[OperationView], bool] | None) -> bool:
    """A terminal operation, or one whose version a conditional poll's caller does not hold."""
    return is_terminal(row) or (known is not None and not known(row))


async def _read_shared(request: web.Request, read: Reader, *, after: int) -> OperationView:
    """The operation, from a read that began at or after the listener's wake-up ``after`` and that the other
    waiters woken with it share; raises ``ProblemError`` 404 when it is gone.
    """
    row = await request.app[CHANGES].read(read.key, read, after=after)
    if row is None:
        raise not_found()
    return row


def _may_have_moved(subscription: Subscription, state: str) -> bool:
    latest = subscription.latest
    return subscription.missed or subscription.closed or (latest is not None and latest.state != state)


async def operation_events(
    request: web.Request, read: Reader, row: OperationView, subscription: Subscription, *, last_event_id: int | None
) -> AsyncIterator[OperationView | None]:
    """For an event stream inside ``watching``: ``row`` first unless ``last_event_id`` is its version (an
    older id, one from the future, or None for an id missing or not a number gets it, so that no client is
    left without the state), then the operation ``read`` returns whenever its version grows, progress alone
    at most every ``PROGRESS_INTERVAL_SECONDS``; it ends after a terminal state, on shutdown or when the
    client goes. A None between them asks for a heartbeat, every ``event_heartbeat_seconds``. A read the
    database cannot answer is tried again every ``READ_RETRY_SECONDS`` meanwhile. The rule: docs/api.md:
    Operations, Waiting for a change.
    """
    heartbeat = request.app[SETTINGS].event_heartbeat_seconds
    loop = asyncio.get_running_loop()
    if row.version != last_event_id:
        yield row
    heartbeat_at, sent_at = loop.time() + heartbeat, loop.time()
    while not is_terminal(row) and not subscription.closed and not client_gone(request):
        until_heartbeat = max(heartbeat_at - loop.time(), 0.0)
        woken = await subscription.wait(
            min(until_heartbeat, READ_RETRY_SECONDS) if subscription.missed else until_heartbeat
        )
        if loop.time() >= heartbeat_at:
            heartbeat_at = loop.time() + heartbeat
            yield None
        latest = subscription.latest
        newer = woken and latest is not None and latest.version > row.version
        if not (subscription.missed or newer):
            continue
        if latest is not None and latest.state == row.state:
            await asyncio.sleep(max(0.0, sent_at + PROGRESS_INTERVAL_SECONDS - loop.time()))
        subscription.missed = False
        try:
            fresh = await request.app[CHANGES].read(read.key, read, after=subscription.woken_at)
        except TRANSIENT_DATABASE_ERRORS as exc:
            # The answer has begun: the stream goes on with heartbeats and reads again at the next check.
            log.warning("operation unreadable; the event stream reads again", extra={"error": type(exc).__name__})
            subscription.missed = True
            continue
        if fresh is None:
            return
        if fresh.version > row.version:
            yield fresh
            sent_at = loop.time()
        row = fresh


async def read_or_404(read: Callable[[], Awaitable[T | None]]) -> T:
    """What ``read`` (a ``Reader`` or its ``stamp``) returns of the operation; raises ``ProblemError`` 404 when it
    finds none."""
    row = await read()
    if row is None:
        raise not_found()
    return row
