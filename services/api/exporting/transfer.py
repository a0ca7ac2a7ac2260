"""Streaming a download to a client that may read slowly or not at all (docs/api.md: Downloads, Download
slots).

Two limits end a transfer: no data accepted for ``write_timeout`` seconds, and fewer than
``min_bytes_per_second`` moved over a window of ``window_seconds``. Progress is what left this process:
the bytes written to the connection minus what still waits in its send buffer, so a client that stops
reading is seen as soon as the buffers between us fill.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from aiohttp import web


@dataclass
class RateWindow:
    """Judges progress window by window: ``sent()`` reads the bytes moved so far (a counter that only
    grows), ``clock()`` the time in seconds.
    """

    min_bytes_per_second: int
    window_seconds: float
    sent: Callable[[], int]
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._started = self.clock()
        self._sent_at_start = self.sent()

    def seconds_left(self) -> float:
        """Seconds until the current window ends (0 when it has)."""
        return max(0.0, self._started + self.window_seconds - self.clock())

    def too_slow(self) -> bool:
        """At a window's end: True when it moved less than its due; then (if not) a new window starts.
        Before the end: False.
        """
        if self.seconds_left() > 0:
            return False
        moved = self.sent() - self._sent_at_start
        if moved < self.min_bytes_per_second * self.window_seconds:
            return True
        self._started, self._sent_at_start = self.clock(), self.sent()
        return False


class TransferCut(Exception):
    """The client stopped reading, read too slowly or went away; the connection has been closed."""


async def stream(
    request: web.Request,
    response: web.StreamResponse,
    chunks: AsyncIterator[bytes],
    *,
    write_timeout: float,
    min_bytes_per_second: int,
    window_seconds: float,
) -> None:
    """Write every chunk of ``chunks`` to the prepared ``response`` within both limits (seconds, bytes per
    second). Raises ``TransferCut`` after aborting the connection when a limit is broken.
    """
    transport = request.transport
    if transport is None:
        raise TransferCut("the client went away")
    written = 0

    def sent() -> int:
        return written - transport.get_write_buffer_size()

    window = RateWindow(min_bytes_per_second, window_seconds, sent)
    async for chunk in chunks:
        written += len(chunk)
        await _write(response, chunk, window, write_timeout, transport)


async def _write(
    response: web.StreamResponse,
    chunk: bytes,
    window: RateWindow,
    write_timeout: float,
    transport: asyncio.Transport,
) -> None:
    """One chunk; the wait is cut at every window end to judge the rate, without cancelling the write."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + write_timeout
    writing = asyncio.ensure_future(response.write(chunk))
    try:
        while True:
            done, _ = await asyncio.wait({writing}, timeout=min(window.seconds_left(), deadline - loop.time()))
            if done:
                try:
                    writing.result()
                except ConnectionError:
                    raise TransferCut("the client went away") from None
                if window.too_slow():
                    raise TransferCut("too slow")
                return
            if loop.time() >= deadline:
                raise TransferCut("no data accepted within the write timeout")
            if window.too_slow():
                raise TransferCut("too slow")
    except TransferCut:
        _reset(transport)
        raise
    finally:
        writing.cancel()


def _reset(transport: asyncio.Transport) -> None:
    """Drop the connection at once: ``close`` would wait for our send buffer to drain, and the kernel would
    go on feeding the slow client what it holds; a zero linger makes the close a reset that discards both.
    """
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
