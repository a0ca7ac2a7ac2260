"""What the client shows on stderr while it waits (docs/command-line.md: Command-line client, Progress): the progress
the server measured (state, phase, messages and bytes written), never an invented percentage or ETA.

On a terminal, one line that rich keeps updating, with the rate between two reports and a percentage only of
the bound the server states (``estimate.messages_at_most``). Anywhere else (a pipe, a file, a cron or systemd
log), a plain line at each state change and whenever the interval has passed since the last one: the clock
drives these, not the server's reports, so an export that hangs keeps printing lines whose counts stay put.
With ``quiet``, nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from typing import IO, Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

DEFAULT_INTERVAL_SECONDS = 10.0
MIN_INTERVAL_SECONDS = 0.1
# A value made of these is written bare; any other is quoted as a JSON string (logfmt), so that a phase such as
# "handed back" stays one field and no control character reaches a log.
BARE_VALUE = re.compile(r"[A-Za-z0-9_.:/+-]+")


class Clock:
    """Monotonic seconds and a sleep on them; unit tests pass a fake one that they move themselves."""

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` (at once when it is not positive)."""
        await asyncio.sleep(seconds)


class ProgressDisplay:
    """Show representations of one operation as they come, on ``console``'s stream; use it as an async context
    manager around the wait. ``interval`` (seconds, > 0) paces the plain lines; ``quiet`` shows nothing.
    """

    def __init__(
        self,
        console: Console,
        *,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        quiet: bool = False,
        clock: Clock | None = None,
    ) -> None:
        clock = clock or Clock()
        self._display: LiveLine | PlainLines | None = None
        if quiet:
            return
        # The stream decides, not rich's guess: FORCE_COLOR or TTY_COMPATIBLE=1 in a job's environment would
        # otherwise put the live line's \r and escape codes into its log.
        if console.file.isatty():
            self._display = LiveLine(console, clock)
        else:
            self._display = PlainLines(console.file, interval, clock)

    async def __aenter__(self) -> ProgressDisplay:
        if self._display is not None:
            await self._display.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._display is not None:
            await self._display.stop()

    def observe(self, operation: dict[str, Any]) -> None:
        """Show ``operation`` (a representation), as the display does."""
        if self._display is not None:
            self._display.observe(operation)


class LiveLine:
    """The terminal's display: one line that rich rewrites with each report, gone once the wait ends."""

    def __init__(self, console: Console, clock: Clock) -> None:
        self._live = Live(Text(""), console=console, transient=True, auto_refresh=False)
        self._clock = clock
        self._last: tuple[float, int] | None = None
        self._rate = 0.0

    async def start(self) -> None:
        """Start drawing."""
        self._live.start()

    async def stop(self) -> None:
        """Stop, and clear the line."""
        self._live.stop()

    def observe(self, operation: dict[str, Any]) -> None:
        """Draw ``operation``'s line."""
        self._live.update(Text(self.line(operation)), refresh=True)

    def line(self, operation: dict[str, Any]) -> str:
        """The status line of ``operation``: state, phase, messages (of the estimate's bound, when there is
        one), bytes (of the estimate's bytes, when there are some) and the rate since the last one.
        """
        progress = operation["progress"]
        written = int(progress["bytes_written"])
        now = self._clock.now()
        if self._last is not None and now > self._last[0] and written >= self._last[1]:
            self._rate = (written - self._last[1]) / (now - self._last[0])
        self._last = (now, written)
        messages = _messages(progress["messages_written"], operation)
        # About what it will store, when the server says (an export with media, before its first byte).
        expected = (operation.get("estimate") or {}).get("bytes")
        stored = human_bytes(written) + (f" of about {human_bytes(expected)}" if expected else "")
        return (
            f"{operation['operation_id']} {operation['state']} ({progress['phase']}): "
            f"{messages}, {stored}, {human_bytes(self._rate)}/s"
        )


class PlainLines:
    """The display of a stream that is not a terminal: a ``plain_line`` at each state change and whenever
    ``interval`` seconds have passed since the last line, each written whole and flushed. Once the stream
    refuses a write (its reader gone, its disk full) no more lines are written, and the export goes on.
    """

    def __init__(self, stream: IO[str], interval: float, clock: Clock) -> None:
        self._stream = stream
        self._interval = interval
        self._clock = clock
        self._latest: dict[str, Any] | None = None
        self._started = self._printed_at = 0.0
        self._stream_failed = False
        self._ticker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the clock that prints between reports."""
        self._started = self._printed_at = self._clock.now()
        self._ticker = asyncio.create_task(self._tick(), name="progress-lines")

    async def stop(self) -> None:
        """Stop the clock."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker

    def observe(self, operation: dict[str, Any]) -> None:
        """Keep ``operation`` for the next line; print one now if its state is new."""
        changed = self._latest is None or operation["state"] != self._latest["state"]
        self._latest = operation
        if changed:
            self._print()

    async def _tick(self) -> None:
        while True:
            await self._clock.sleep(self._printed_at + self._interval - self._clock.now())
            # A state change may have printed meanwhile and so put the next line further off.
            if self._clock.now() >= self._printed_at + self._interval:
                self._print()

    def _print(self) -> None:
        now = self._clock.now()
        self._printed_at = now
        if self._latest is None or self._stream_failed:
            return
        try:
            self._stream.write(plain_line(self._latest, elapsed=now - self._started) + "\n")
            self._stream.flush()
        except OSError:
            # A log that stopped taking lines (its reader gone, its disk full) must not end the export.
            self._stream_failed = True


def plain_line(operation: dict[str, Any], *, elapsed: float) -> str:
    """``operation``'s line for a log: ``chatexport progress`` then logfmt fields ``operation``, ``state``,
    ``phase``, ``messages`` and ``bytes`` (written so far, as the server measured them) and ``elapsed``
    (``elapsed`` seconds since the wait began, one decimal, with an ``s``) (docs/command-line.md: Command-line client,
    Progress).
    """
    progress = operation["progress"]
    fields = {
        "operation": operation["operation_id"],
        "state": operation["state"],
        "phase": progress["phase"],
        "messages": progress["messages_written"],
        "bytes": progress["bytes_written"],
        "elapsed": f"{elapsed:.1f}s",
    }
    return " ".join(["chatexport progress", *(f"{name}={_logfmt(value)}" for name, value in fields.items())])


def _logfmt(value: object) -> str:
    text = str(value)
    return text if BARE_VALUE.fullmatch(text) else json.dumps(text)


def _messages(written: int, operation: dict[str, Any]) -> str:
    """``written`` messages, with the share of the server's bound when it states one (servers before the
    estimate existed do not).
    """
    bound = (operation.get("estimate") or {}).get("messages_at_most")
    if bound is None:
        return f"{written:,} messages"
    # The bound is an upper one, so the share is a lower one; it cannot pass 100 %.
    percent = 100 if written >= bound else 100 * written // bound
    return f"{written:,} of at most {bound:,} messages ({percent}%)"


def human_bytes(count: float) -> str:
    """``count`` bytes as B, KiB, MiB or GiB with one decimal."""
    for unit in ("B", "KiB", "MiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"
