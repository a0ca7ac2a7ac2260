"""What the client shows while it waits: the progress the server measured (phase, messages and bytes
written, and the rate between two reports), never an invented percentage. On a terminal, one line that
rich keeps updating; otherwise nothing but the final result.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text


class Progress:
    """Show representations of one operation as they come; use it as a context manager."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._live = Live(Text(""), console=console, transient=True, auto_refresh=False)
        self._last: tuple[float, int] | None = None
        self._rate = 0.0

    def __enter__(self) -> Progress:
        if self._console.is_terminal:
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._console.is_terminal:
            self._live.stop()

    def observe(self, operation: dict[str, Any]) -> None:
        """Show ``operation`` (a representation); a no-op when not on a terminal."""
        if not self._console.is_terminal:
            return
        self._live.update(Text(self.line(operation)), refresh=True)

    def line(self, operation: dict[str, Any]) -> str:
        """The status line of ``operation``: state, phase, messages, bytes and the rate since the last one."""
        progress = operation["progress"]
        written = int(progress["bytes_written"])
        now = time.monotonic()
        if self._last is not None and now > self._last[0] and written >= self._last[1]:
            self._rate = (written - self._last[1]) / (now - self._last[0])
        self._last = (now, written)
        return (
            f"{operation['operation_id']} {operation['state']} ({progress['phase']}): "
            f"{progress['messages_written']:,} messages, {human_bytes(written)}, {human_bytes(self._rate)}/s"
        )


def human_bytes(count: float) -> str:
    """``count`` bytes as B, KiB, MiB or GiB with one decimal."""
    for unit in ("B", "KiB", "MiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"
