"""A lease with a fencing generation, the one way every kind of work holds what it works on (docs/architecture.md:
Leases and fencing): an export operation, a chunk of one, a batch of completion callbacks.

The holder extends its lease by a heartbeat while it works (``heartbeating``); every write it makes names the
generation it claimed, and a write that matches nothing means another generation holds the work, or it was
canceled: the holder raises ``LeaseLost`` and stops there. A holder stopped while it works hands its lease
back (``handed_back_on_stop``). What a lease covers, and each table's claim, extend, finish and release, are
that table's SQL (``shared.repository``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from shared.db import TRANSIENT_DATABASE_ERRORS
from shared.lifecycle import being_cancelled, outlast_cancels

log = logging.getLogger(__name__)

# Extends the lease once: True while it is still held, False once the fence refused it.
Extend = Callable[[], Awaitable[bool]]
# Ends the lease at once, with no attempt spent, so that another holder takes the work without waiting.
HandBack = Callable[[], Awaitable[None]]


class LeaseLost(Exception):
    """A fenced write matched nothing: another generation holds the work, or it was canceled.

    ``write`` names the rejected write (``artifact``, ``progress``, ``result``, ``state``, ``heartbeat``, ``chunk``).
    """

    def __init__(self, write: str) -> None:
        super().__init__(write)
        self.write = write


@contextlib.asynccontextmanager
async def heartbeating(
    extend: Extend, *, every_seconds: float, name: str, log_extra: Mapping[str, Any]
) -> AsyncIterator[None]:
    """Call ``extend`` every ``every_seconds`` (the ``heartbeat_seconds`` setting) while the block runs, in a
    task called ``name``. A transient database error is logged (with ``log_extra``) and the next beat tries
    again; once ``extend`` returns False the heartbeat ends, and the work stops at its next fenced write.
    """

    async def beat() -> None:
        while True:
            await asyncio.sleep(every_seconds)
            try:
                if not await extend():
                    return
            except TRANSIENT_DATABASE_ERRORS:
                log.warning("heartbeat failed; will try again", extra=dict(log_extra))

    heartbeat = asyncio.create_task(beat(), name=name)
    try:
        yield
    finally:
        heartbeat.cancel()
        # Not ``await heartbeat``: its CancelledError would hide a cancel of this task that came meanwhile.
        await asyncio.wait({heartbeat})


@contextlib.asynccontextmanager
async def handed_back_on_stop(hand_back: HandBack, *, log_extra: Mapping[str, Any]) -> AsyncIterator[None]:
    """Run the block; when the task is stopped meanwhile (``CancelledError``, or a cancel that surfaced as the
    driver's own error: asyncpg interrupted mid-COPY raises ``InternalClientError``), hand the lease back and
    raise ``CancelledError``, so that a shutdown spends no attempt and leaves no lease to wait for
    (docs/kubernetes.md: Stopping and scaling down). ``LeaseLost`` and the errors of a task not being stopped
    pass through.
    """
    try:
        yield
    except asyncio.CancelledError:
        await hand_back_to_the_end(hand_back, log_extra=log_extra)
        raise
    except Exception as exc:
        if isinstance(exc, LeaseLost) or not being_cancelled():
            raise
        await hand_back_to_the_end(hand_back, log_extra=log_extra)
        raise asyncio.CancelledError from exc


async def hand_back_to_the_end(hand_back: HandBack, *, log_extra: Mapping[str, Any]) -> None:
    """Run ``hand_back`` to its end however often the stop is repeated meanwhile; a failure is logged (with
    ``log_extra``), and the lease then expires as it would have."""
    handing = asyncio.ensure_future(hand_back())
    await outlast_cancels(handing)
    if not handing.cancelled() and handing.exception() is not None:
        log.warning(
            "could not hand a lease back on a stop; it expires", extra=dict(log_extra), exc_info=handing.exception()
        )
