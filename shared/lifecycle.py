"""Process lifecycle shared by the background parts: stop signals and draining in-flight tasks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from shared.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")


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


async def run_until_signalled(serve: Callable[..., Awaitable[None]], settings: Settings) -> None:
    """Run ``serve(settings, stop=event)``; SIGINT or SIGTERM sets the event so that it drains and returns."""
    stop = asyncio.Event()
    with stop_on_signals(stop), contextlib.suppress(Stopped):
        await serve(settings, stop=stop)


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
