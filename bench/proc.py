"""What a running process has used so far, read from ``/proc``: the benchmarks' memory and CPU figures."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

# Linux counts a process's CPU time in clock ticks; USER_HZ is 100 on every architecture it runs on.
TICKS_PER_SECOND = 100


def process_figures(pid: int) -> tuple[float, float]:
    """Process ``pid``'s resident memory (MB) and CPU time so far, user and system (s).

    Raises ``FileNotFoundError`` when there is no such process.
    """
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    # The command name in parentheses may hold spaces: the fields are counted from its closing one.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return rss_kb / 1024, (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND


def cpu_times(pids: Iterable[int]) -> dict[int, float]:
    """The CPU time (s) each of the processes ``pids`` still running has used so far, by pid."""
    times = {}
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            times[pid] = process_figures(pid)[1]
    return times


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """The CPU time (s) used between two ``cpu_times`` by the processes that ran at both."""
    return sum(after[pid] - before[pid] for pid in before.keys() & after.keys())


def pids_of(command: str) -> list[int]:
    """The pids of every process whose command name (``/proc/<pid>/comm``) is ``command``, whoever runs it."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, NotADirectoryError):
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == command:
                found.append(int(entry.name))
    return found
