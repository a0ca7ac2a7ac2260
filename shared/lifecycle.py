"""Process lifecycle shared by the background parts: stop signals and draining in-flight tasks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Iterator

from shared.settings import Settings

log = logging.getLogger(__name__)


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
    with stop_on_signals(stop):
        await serve(settings, stop=stop)
