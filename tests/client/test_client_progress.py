"""The client's progress on a stderr that is not a terminal (docs/command-line.md: Command-line client, Progress): a
plain line at each state change and whenever the interval has passed, paced by the clock rather than by the
server's reports, in one greppable shape without ``\\r`` or escape codes; ``--quiet`` silences it.
"""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import Callable
from typing import Any

import pytest
from rich.console import Console

from chatexport.client.progress import Clock, ProgressDisplay, plain_line

LINE = re.compile(
    r"chatexport progress operation=(?P<operation>\S+) state=(?P<state>[A-Z_]+) phase=(?P<phase>\S+|\"[^\"]*\") "
    r"messages=(?P<messages>[0-9]+) bytes=(?P<bytes>[0-9]+) elapsed=(?P<elapsed>[0-9]+\.[0-9])s"
)
# More sleeps than any test here needs: a ticker that asks for no time at all fails instead of spinning.
MAX_SLEEPS = 100


class FakeClock(Clock):
    """Time that moves only when the code under test sleeps: each sleep runs the actions scheduled up to its
    end (``at``), at their own times; a sleep that would reach ``end`` parks the sleeper and sets ``ended``.
    """

    def __init__(self, end: float) -> None:
        self.time = 0.0
        self.end = end
        self.ended = asyncio.Event()
        self.actions: list[tuple[float, Callable[[], None]]] = []
        self.sleeps = 0

    def at(self, when: float, action: Callable[[], None]) -> None:
        self.actions.append((when, action))

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        assert self.sleeps <= MAX_SLEEPS, "the ticker spins"
        until = self.time + max(seconds, 0.0)
        for when, action in sorted((due for due in self.actions if due[0] <= until), key=lambda due: due[0]):
            self.actions.remove((when, action))
            self.time = when
            action()
        if until >= self.end:
            self.ended.set()
            await asyncio.Event().wait()  # parked until the ticker is cancelled
        self.time = until


def representation(state: str, messages: int = 0, phase: str = "writing") -> dict[str, Any]:
    return {
        "operation_id": "op_1",
        "state": state,
        "progress": {"phase": phase, "messages_written": messages, "bytes_written": messages * 100},
    }


async def lines_until(
    clock: FakeClock, progress: ProgressDisplay, stream: io.StringIO, first: dict[str, Any]
) -> list[str]:
    """Observe ``first`` at time 0, let ``clock`` run to its end, and return the lines written."""
    async with progress:
        progress.observe(first)
        await asyncio.wait_for(clock.ended.wait(), 10)
    return stream.getvalue().splitlines()


def fields(line: str) -> dict[str, str]:
    match = LINE.fullmatch(line)
    assert match is not None, line
    return match.groupdict()


async def test_a_line_comes_every_interval_even_when_the_server_reports_nothing() -> None:
    clock, stream = FakeClock(end=35), io.StringIO()
    progress = ProgressDisplay(Console(file=stream), interval=10, clock=clock)

    lines = await lines_until(clock, progress, stream, representation("RUNNING", 40))

    # A hung export shows as lines whose counts do not move.
    assert [(fields(line)["elapsed"], fields(line)["messages"]) for line in lines] == [
        ("0.0", "40"),
        ("10.0", "40"),
        ("20.0", "40"),
        ("30.0", "40"),
    ]


async def test_a_state_change_prints_at_once_and_the_interval_counts_from_it() -> None:
    clock, stream = FakeClock(end=30), io.StringIO()
    progress = ProgressDisplay(Console(file=stream), interval=10, clock=clock)
    clock.at(4, lambda: progress.observe(representation("RUNNING", 10)))
    clock.at(7, lambda: progress.observe(representation("RUNNING", 500)))  # a report, no change of state
    clock.at(21, lambda: progress.observe(representation("SUCCEEDED", 900, "done")))

    lines = await lines_until(clock, progress, stream, representation("QUEUED", phase="waiting"))

    assert [(fields(line)["elapsed"], fields(line)["state"], fields(line)["messages"]) for line in lines] == [
        ("0.0", "QUEUED", "0"),
        ("4.0", "RUNNING", "10"),
        ("14.0", "RUNNING", "500"),
        ("21.0", "SUCCEEDED", "900"),
    ]


async def test_quiet_prints_nothing() -> None:
    stream = io.StringIO()
    progress = ProgressDisplay(Console(file=stream), interval=10, quiet=True, clock=FakeClock(end=35))

    async with progress:
        progress.observe(representation("RUNNING"))
        progress.observe(representation("SUCCEEDED"))

    assert stream.getvalue() == ""


async def test_a_forced_colour_environment_still_gets_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    # rich would take these for a terminal; a job's log would then get \r and escape codes.
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    clock, stream = FakeClock(end=15), io.StringIO()

    progress = ProgressDisplay(Console(file=stream), interval=10, clock=clock)

    lines = await lines_until(clock, progress, stream, representation("RUNNING"))

    assert len(lines) == 2
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()


class RefusingStream(io.StringIO):
    """A stderr whose reader has gone: every write fails as a broken pipe does."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


async def test_a_log_that_stops_taking_lines_does_not_end_the_export() -> None:
    clock = FakeClock(end=35)
    stream = RefusingStream()
    progress = ProgressDisplay(Console(file=stream), interval=10, clock=clock)
    clock.at(12, lambda: progress.observe(representation("RUNNING", 5)))
    async with progress:
        progress.observe(representation("QUEUED"))
        await asyncio.wait_for(clock.ended.wait(), 10)
        progress.observe(representation("SUCCEEDED", 9))
    assert clock.time >= 30  # the ticker ran on past the refused writes


def test_the_line_has_one_greppable_shape() -> None:
    operation = representation("RUNNING", 12_345)
    assert plain_line(operation, elapsed=20.04) == (
        "chatexport progress operation=op_1 state=RUNNING phase=writing messages=12345 bytes=1234500 elapsed=20.0s"
    )
    # A value with a space (or anything else a log could mangle) is quoted, logfmt style.
    handed_back = representation("QUEUED", 7, "handed back\r\x1b[2K")
    assert 'phase="handed back\\r\\u001b[2K" messages=7 ' in plain_line(handed_back, elapsed=0)
