"""Operation changes for long polls and event streams: one Postgres ``LISTEN`` per API process on a
connection of its own, fanned out in memory to the requests that wait (docs/api.md: Operations, Waiting for a
change).

The trigger of migration 0005 announces every change a client can see as ``<operation_id> <version>
<state>``. A subscription remembers the newest change of its operation and wakes its waiter; it never
queues, so a slow reader cannot make memory grow. The process listens only while it has waiters, and for
``LINGER_SECONDS`` after the last one left, so that a process nobody waits on is not sent every change of
every export. Whenever nothing was announced to it for a while (before its ``LISTEN`` took effect, or while
the connection was down) every subscription is woken as ``missed`` (its waiter reads the operation again);
a lost connection is opened again after ``RECONNECT_SECONDS``. Changes are hints; the database stays the
source of truth.

Waiters woken together read together: ``OperationChanges.read`` hands one read of an operation to every
waiter that asks for it while it is in flight, provided it began after the wake-up each of them saw, so a
change (or a reconnect) costs one read per distinct operation, not one per waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
from aiohttp import web

from shared.db import TRANSIENT_DATABASE_ERRORS, ReadOnlyServer, close_connection, connect
from shared.lifecycle import first_set
from shared.settings import ApiPartSettings

log = logging.getLogger(__name__)

CHANNEL = "chatexport_operation_changes"
# Between attempts to open the LISTEN connection again after it was lost.
RECONNECT_SECONDS = 1.0
# What makes the listener wait and connect again, with a warning: the database is unreachable, or a standby.
_UNAVAILABLE: tuple[type[BaseException], ...] = (*TRANSIENT_DATABASE_ERRORS, ReadOnlyServer)
# How long the process keeps listening after its last waiter left: a client that polls again at once, or
# steady long polls, do not make it stop and start (each start wakes every waiter to read again).
LINGER_SECONDS = 10.0
# Between two looks at every waiter's connection: a waiter whose client went away gives its slot back
# within this.
GONE_CHECK_SECONDS = 1.0

T = TypeVar("T")


@dataclass(frozen=True)
class Change:
    """One announced change: the operation's ``version`` after it, and its ``state``."""

    version: int
    state: str


class Subscription:
    """The changes of one operation as one waiter sees them: the newest only. ``gone`` tells whether the
    waiter's client went away; the listener's sweep wakes it then.
    """

    def __init__(self, gone: Callable[[], bool] = lambda: False) -> None:
        self.gone = gone
        self._woken = asyncio.Event()
        self.latest: Change | None = None
        self.missed = False
        self.closed = False
        # The listener's sequence number of the last wake-up delivered (``OperationChanges.read``).
        self.woken_at = 0

    def _deliver(self, change: Change | None, sequence: int) -> None:
        self.woken_at = sequence
        if change is None:
            self.missed = True
        elif self.latest is None or change.version > self.latest.version:
            self.latest = change
        self._woken.set()

    def _close(self) -> None:
        self.closed = True
        self._woken.set()

    def _wake(self) -> None:
        self._woken.set()

    async def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a change, a missed stretch, the close or the client's going; True when
        woken. The caller reads ``latest``, ``missed`` and ``closed`` (and whether its client is gone), and
        resets ``missed`` once it has read the operation again.
        """
        try:
            async with asyncio.timeout(seconds):
                await self._woken.wait()
        except TimeoutError:
            return False
        self._woken.clear()
        return True


class OperationChanges:
    """The process's listener: ``start`` it, ``subscribe`` per waiting request, ``close`` it on shutdown
    (which wakes every waiter as ``closed``).
    """

    def __init__(self, settings: ApiPartSettings, *, linger_seconds: float = LINGER_SECONDS) -> None:
        self._settings = settings
        self._linger_seconds = linger_seconds
        self._subscriptions: defaultdict[str, set[Subscription]] = defaultdict(set)
        self._connection: asyncpg.Connection | None = None
        self._listening = False
        self._keeper: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()
        # Set while some subscription is open, and while none is.
        self._wanted = asyncio.Event()
        self._unwanted = asyncio.Event()
        self._unwanted.set()
        self._closed = False
        self._sequence = 0
        # Reads in flight by key: the sequence number when each began, and its task.
        self._reads: dict[Hashable, tuple[int, asyncio.Task[Any]]] = {}

    @property
    def sequence(self) -> int:
        """How many wake-ups (changes and missed stretches) this listener has delivered so far."""
        return self._sequence

    async def read(self, key: Hashable, read: Callable[[], Awaitable[T]], *, after: int) -> T:
        """What ``read()`` returns, from a read of ``key`` (one operation as one caller may see it) that
        began at or after sequence number ``after`` (a subscription's ``woken_at``, or ``sequence`` for a read
        from now on): one already in flight is joined, else one is started. Raises what ``read`` raises.
        """
        in_flight = self._reads.get(key)
        if in_flight is None or in_flight[0] < after:
            task = asyncio.ensure_future(read())
            in_flight = (self._sequence, task)
            self._reads[key] = in_flight
            task.add_done_callback(lambda _task: self._forget(key, in_flight))
        # Shielded: a waiter whose client went away must not cancel the read the others wait for.
        result: T = await asyncio.shield(in_flight[1])
        return result

    def _forget(self, key: Hashable, in_flight: tuple[int, asyncio.Task[Any]]) -> None:
        if self._reads.get(key) is in_flight:
            del self._reads[key]
        task = in_flight[1]
        if not task.cancelled():
            task.exception()  # retrieved here: every waiter may have gone, and each one that stayed got it

    @property
    def connected(self) -> bool:
        """True while the LISTEN connection is open, listening or not."""
        return self._connection is not None and not self._connection.is_closed()

    @property
    def listening(self) -> bool:
        """True while the process's ``LISTEN`` is in effect: changes announced now reach its waiters."""
        return self._listening and self.connected

    @property
    def waiters(self) -> int:
        """Subscriptions open right now."""
        return sum(len(subscriptions) for subscriptions in self._subscriptions.values())

    async def start(self) -> None:
        """Open the LISTEN connection in the background and keep it open until ``close``."""
        self._keeper = asyncio.create_task(self._keep_listening(), name="operation-changes")
        self._sweeper = asyncio.create_task(self._sweep(), name="operation-waiters-sweep")

    async def close(self) -> None:
        """Stop listening and wake every subscription as ``closed``."""
        self._closed = True
        for subscriptions in self._subscriptions.values():
            for subscription in subscriptions:
                subscription._close()
        for task in (self._keeper, self._sweeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._connection is not None:
            await close_connection(self._connection)

    @contextlib.contextmanager
    def subscribe(self, operation_id: str, *, gone: Callable[[], bool] = lambda: False) -> Iterator[Subscription]:
        """A subscription to the changes of ``operation_id`` for the block, whose waiter's client has gone when
        ``gone()`` says so; closed at once after ``close``.
        """
        subscription = Subscription(gone)
        if self._closed:
            subscription._close()
        self._subscriptions[operation_id].add(subscription)
        self._note_wanted()
        try:
            yield subscription
        finally:
            self._subscriptions[operation_id].discard(subscription)
            if not self._subscriptions[operation_id]:
                del self._subscriptions[operation_id]
            self._note_wanted()

    def _note_wanted(self) -> None:
        """Set ``_wanted`` while some subscription is open, ``_unwanted`` while none is."""
        wanted = bool(self._subscriptions)
        (self._wanted if wanted else self._unwanted).set()
        (self._unwanted if wanted else self._wanted).clear()

    async def _sweep(self) -> None:
        """Every ``GONE_CHECK_SECONDS``, wake the subscriptions whose client went away: aiohttp does not cancel
        their handlers, and one sweep of the process costs less than a timer per waiter.
        """
        while True:
            await asyncio.sleep(GONE_CHECK_SECONDS)
            for subscriptions in self._subscriptions.values():
                for subscription in subscriptions:
                    if subscription.gone():
                        subscription._wake()

    async def _keep_listening(self) -> None:
        while True:
            try:
                await self._connect()
                await self._listen_while_wanted()
                log.warning("operation changes connection lost; reconnecting")
            except _UNAVAILABLE as exc:
                log.warning(
                    "operation changes unavailable; waits end at their deadline", extra={"error": type(exc).__name__}
                )
            except Exception:
                # Whatever else refuses the connection (a database not accepting connections, too many
                # clients), the listener must outlive it: it tries again, and waits end at their deadline.
                log.exception("operation changes cannot listen; retrying")
            self._listening = False
            if self._connection is not None:
                self._connection.terminate()
            self._wake_all_missed()
            await asyncio.sleep(RECONNECT_SECONDS)

    async def _connect(self) -> None:
        """Open the connection the process listens on, and note when it is lost. It is kept while nobody waits,
        so it is opened on a server that takes writes: a standby would refuse the first LISTEN (25006) only
        when a waiter came.
        """
        self._lost.clear()
        connection = await connect(self._settings, writable=True)
        connection.add_termination_listener(lambda _connection: self._lost.set())
        self._connection = connection

    async def _listen_while_wanted(self) -> None:
        """LISTEN on the open connection while the process has waiters and for ``linger_seconds`` after the
        last one left, as often as they come back; returns when the connection is lost.
        """
        connection = self._connection
        assert connection is not None
        while await self._first(self._wanted):
            await connection.add_listener(CHANNEL, self._on_notification)
            self._listening = True
            # Announcements made before the LISTEN took effect did not reach this process: every waiter reads
            # again.
            self._wake_all_missed()
            while await self._first(self._unwanted):
                try:
                    async with asyncio.timeout(self._linger_seconds):
                        if not await self._first(self._wanted):
                            return
                except TimeoutError:
                    break
            else:
                return
            self._listening = False
            await connection.remove_listener(CHANNEL, self._on_notification)

    async def _first(self, event: asyncio.Event) -> bool:
        """Wait until ``event`` is set (True) or the connection is lost (False)."""
        await first_set(event, self._lost)
        return not self._lost.is_set()

    def _wake_all_missed(self) -> None:
        self._sequence += 1
        for subscriptions in self._subscriptions.values():
            for subscription in subscriptions:
                subscription._deliver(None, self._sequence)

    def _on_notification(self, _connection: Any, _pid: int, _channel: str, payload: str) -> None:
        try:
            operation_id, version, state = payload.split(" ")
            change = Change(int(version), state)
        except ValueError:
            log.warning("malformed operation change ignored")
            return
        self._sequence += 1
        for subscription in self._subscriptions.get(operation_id, ()):
            subscription._deliver(change, self._sequence)


# Where the application keeps its one ``OperationChanges`` (opened and closed by ``services.api.app``).
CHANGES = web.AppKey("changes", OperationChanges)
