"""What the client shows while it waits: the progress the server measured (phase, messages and bytes
written, and the rate between two reports), and a percentage only of the bound the server states
(``estimate.messages_at_most``), never an invented one. On a terminal, one line that rich keeps updating;
otherwise nothing but the final result.
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
        """The status line of ``operation``: state, phase, messages (of the estimate's bound, when there is
        one), bytes and the rate since the last one.
        """
        progress = operation["progress"]
        written = int(progress["bytes_written"])
        now = time.monotonic()
        if self._last is not None and now > self._last[0] and written >= self._last[1]:
            self._rate = (written - self._last[1]) / (now - self._last[0])
        self._last = (now, written)
        messages = _messages(progress["messages_written"], operation)
        return (
            f"{operation['operation_id']} {operation['state']} ({progress['phase']}): "
            f"{messages}, {human_bytes(written)}, {human_bytes(self._rate)}/s"
        )


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
