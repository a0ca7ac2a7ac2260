"""Process lifecycle shared by the parts: where they listen, stop signals and draining in-flight tasks."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

from aiohttp import web

from shared.settings import CommonSettings
from shared.version import VERSION

log = logging.getLogger(__name__)

T = TypeVar("T")

# True while a part runs as its process's own (``run_until_signalled``): only then does ``started`` freeze.
_OWN_PROCESS: ContextVar[bool] = ContextVar("own_process", default=False)


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """Set ``stop`` on SIGINT or SIGTERM while inside the block; the previous handlers come back after."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def listening_site(runner: web.BaseRunner, host: str, port: int, socket_fd: int | None) -> web.BaseSite:
    """The site ``runner`` serves on: the inherited listening socket ``socket_fd`` when one is given (the
    ``*_socket_fd`` settings), else ``host:port`` bound as the site starts (port 0 picks a free one).
    """
    if socket_fd is None:
        return web.TCPSite(runner, host, port)
    return web.SockSite(runner, socket.socket(fileno=socket_fd))


async def drain(tasks: set[asyncio.Task[None]], *, grace_seconds: float) -> None:
    """Wait up to ``grace_seconds`` until ``tasks`` (a live set, which may still gain members) is empty,
    then cancel what is left and wait for it.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_seconds
    while tasks and loop.time() < deadline:
        await asyncio.wait(set(tasks), timeout=deadline - loop.time())
    pending = set(tasks)
    for task in pending:
        task.cancel()
    if pending:
        log.info("grace period over; cancelling in-flight work", extra={"tasks": len(pending)})
        await asyncio.wait(pending)


async def run_until_signalled(serve: Callable[..., Awaitable[None]], settings: CommonSettings) -> None:
    """Run ``serve(settings, stop=event)``; SIGINT or SIGTERM sets the event so that it drains and returns. Logs
    the start with this release's version.
    """
    log.info("starting", extra={"version": VERSION})
    own = _OWN_PROCESS.set(True)
    stop = asyncio.Event()
    try:
        with stop_on_signals(stop), contextlib.suppress(Stopped):
            await serve(settings, stop=stop)
    finally:
        _OWN_PROCESS.reset(own)


def started() -> None:
    """Mark the end of a part's start-up, once it has built what it keeps for its life (imports, settings,
    pools, the S3 client's service model) and before it takes work: collect what start-up left as garbage,
    then move every object alive into the collector's permanent generation (``gc.freeze``), which its later
    passes never walk. A full pass over a worker's 123,000 start-up objects held the event loop for 60-80 ms,
    about twice in every thousand exports (docs/benchmark.md: The collector's full passes).

    Only in a part run by ``run_until_signalled``: a part served inside another program (a test) leaves that
    program's collector alone. The price: an object frozen here that later dies in a reference cycle (a pool's
    first connection closed after it idled) is freed by no pass, with what it still references then; each
    frozen object can leak so once at most.
    """
    if _OWN_PROCESS.get():
        gc.collect()
        gc.freeze()


async def first_set(*events: asyncio.Event, within_seconds: float | None = None) -> None:
    """Wait until one of ``events`` is set, or until ``within_seconds`` have passed (None: no limit); the
    caller reads which one is set. Returns at once when one already is.
    """
    if any(event.is_set() for event in events):
        return
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=within_seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds``, or less if ``stop`` is set meanwhile; return whether it is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


class Stopped(Exception):
    """A stop was requested while a dependency was still out of reach."""


async def keep_trying(
    open_resource: Callable[[], Awaitable[T]],
    *,
    what: str,
    errors: tuple[type[BaseException], ...],
    stop: asyncio.Event,
    first_delay_seconds: float = 1.0,
    max_delay_seconds: float = 30.0,
) -> T:
    """Call ``open_resource`` until it succeeds, waiting ``first_delay_seconds`` (1 s), then twice as long
    each time up to ``max_delay_seconds`` between tries and logging each failure, so a part started before
    its dependency waits for it.

    Only ``errors`` are retried. Raises ``Stopped`` when ``stop`` is set before it succeeds.
    """
    delay = first_delay_seconds
    while True:
        try:
            return await open_resource()
        except errors as exc:
            log.warning("%s unavailable; retrying", what, extra={"error": type(exc).__name__, "retry_in_s": delay})
        if await sleep_unless_stopped(stop, delay):
            raise Stopped(what)
        delay = min(delay * 2, max_delay_seconds)


# Set by the development supervisor on the parts it starts (devtools.processes): its pid.
PARENT_PID_ENV = "CHATEXPORT_PARENT_PID"
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when the thread that started it ends; elsewhere do nothing.

    Only calls ``prctl``, so it is safe as a ``preexec_fn``.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


# glibc's mallopt parameter (<malloc.h>), and the size from which the worker's allocations are mapped on their own.
_M_MMAP_THRESHOLD = -3
LARGE_ALLOCATION_BYTES = 1024 * 1024


def map_large_allocations() -> None:
    """Have glibc's malloc map each allocation of ``LARGE_ALLOCATION_BYTES`` or more on its own and unmap it
    when it is freed; with another C library, or off Linux, do nothing.

    By default glibc raises that threshold to the size of each mapped block freed (up to 32 MiB), so once the
    first export range is freed, the next ranges and parts (megabytes each) come from the heap, and what they
    leave between the objects allocated after them stays resident: the worker's peak during the 1M export was
    121-125 MB that way and 110 MB with this (docs/benchmark.md: Memory).
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, LARGE_ALLOCATION_BYTES)


def follow_parent() -> None:
    """Under a supervisor (``CHATEXPORT_PARENT_PID``), get SIGTERM when it dies, even by SIGKILL.

    Linux only; elsewhere, or without the variable, nothing happens. The variable is removed so that
    programs this part starts are not tied to the supervisor. Raises ``SystemExit`` when the supervisor
    is gone already.
    """
    expected = os.environ.pop(PARENT_PID_ENV, None)
    if not expected or not expected.isdigit() or not sys.platform.startswith("linux"):
        return
    die_with_parent()
    # The supervisor may have died before prctl took effect; then no signal will ever come.
    if os.getppid() != int(expected) and not _alive(int(expected)):
        raise SystemExit("chatexport: the supervising process is gone; not starting")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists but belongs to someone else
    return True


def being_cancelled() -> bool:
    """Whether the running task has been asked to stop: a cancel can surface as another error (asyncpg
    interrupted mid-COPY raises ``InternalClientError``), and a shutdown must still be told from a failure."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def outlast_cancels(task: asyncio.Future[Any]) -> None:
    """Wait until ``task`` has ended, however often this wait is cancelled meanwhile: work that must not be cut
    in half (a claim whose commit is under way, the hand-back of its lease) ends before the canceller goes on.
    Its outcome stays on ``task``; the caller re-raises its own ``CancelledError`` afterwards.
    """
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task})
