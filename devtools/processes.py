"""A group of child processes started, signalled and reaped from Python: ``chatexport dev`` and e2e tests.

Each part runs in its own session (process group), so a terminal's Ctrl-C reaches only the supervisor,
which then stops the parts in order, and a signal sent to a part also reaches anything the part spawned.
A part's stdout and stderr are merged and read line by line by a pump thread that keeps the last lines,
appends them to ``<log_dir>/<name>.log`` when a folder is given, and calls the sink when one is given.

Children started here get ``CHATEXPORT_PARENT_PID``; ``chatexport <part>`` reads it and asks Linux to
send it SIGTERM when its parent goes away (``PR_SET_PDEATHSIG``), so even a SIGKILLed supervisor leaves no
orphans. Linux ties that signal to the THREAD that started the child: start parts from a thread that
lives as long as they should (the main thread, or the event loop's thread in tests).
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

from shared.lifecycle import PARENT_PID_ENV

TAIL_LINES = 1000  # lines of output kept in memory per part

OutputSink = Callable[[str, str], None]
"""Called as ``sink(part_name, line)`` from the part's pump thread, ``line`` without its newline."""


@dataclass
class Part:
    """One started child: its name in the group, command line, process and the last lines it printed."""

    name: str
    args: list[str]
    process: subprocess.Popen[bytes]
    own_session: bool = True
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    lines_total: int = 0
    pump: threading.Thread | None = None

    @property
    def pid(self) -> int:
        """The child's process id (also its process group id when ``own_session``)."""
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """None while running; else the exit code, negative for the signal that ended it."""
        return self.process.poll()

    @property
    def stopped(self) -> bool:
        """Whether the running child is stopped by a signal (SIGSTOP): state ``T`` in ``/proc/<pid>/stat``."""
        if self.process.poll() is not None:
            return False
        try:
            stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        except FileNotFoundError:
            return False
        # The command name in parentheses may hold spaces: the state is the first field after it.
        return stat.rsplit(")", 1)[1].split()[0] == "T"

    def signal(self, sig: int) -> None:
        """Deliver ``sig`` to the part (its whole process group); a part that already ended is skipped."""
        if self.process.poll() is not None:
            return  # reaped: the pid may belong to someone else by now
        with contextlib.suppress(ProcessLookupError):
            if self.own_session:
                os.killpg(self.process.pid, sig)
            else:
                self.process.send_signal(sig)


class ProcessGroup:
    """Named child processes with output capture; use as a context manager to stop them all on exit.

    ``sink`` receives every output line; ``log_dir`` (created when missing) receives one ``<name>.log``
    per part, appended to, so a restarted part continues its file.
    """

    def __init__(self, *, sink: OutputSink | None = None, log_dir: Path | None = None) -> None:
        self._sink = sink
        self._log_dir = log_dir
        self._parts: dict[str, Part] = {}
        self._changed = threading.Condition()
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()

    def start(
        self,
        name: str,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        cwd: Path | None = None,
        pass_fds: Sequence[int] = (),
    ) -> Part:
        """Start ``args`` as part ``name`` with the COMPLETE environment ``env`` (None: ours), inheriting the
        file descriptors ``pass_fds`` under the same numbers.

        Raises ``ValueError`` when a part of that name is still running, ``OSError`` when the program
        cannot be started.
        """
        if name in self._parts and self._parts[name].returncode is None:
            raise ValueError(f"part {name!r} is already running")
        child_env = dict(os.environ if env is None else env)
        child_env.setdefault("PYTHONUNBUFFERED", "1")  # lines appear as they are written, not per 8 KiB
        child_env[PARENT_PID_ENV] = str(os.getpid())
        process = subprocess.Popen(
            list(args),
            env=child_env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )
        part = Part(name, list(args), process)
        part.pump = threading.Thread(target=self._pump, args=(part,), name=f"pump-{name}", daemon=True)
        self._parts[name] = part
        part.pump.start()
        return part

    def adopt(self, name: str, process: subprocess.Popen[bytes]) -> Part:
        """Track a process started elsewhere (no output capture; signalled as a single process)."""
        part = Part(name, [str(process.args)], process, own_session=False)
        self._parts[name] = part
        return part

    def part(self, name: str) -> Part:
        """The part called ``name``; raises ``KeyError`` when there is none."""
        return self._parts[name]

    def pids(self) -> dict[str, int]:
        """``{name: pid}`` of the parts still running."""
        return {name: part.pid for name, part in self._parts.items() if part.returncode is None}

    def exited(self) -> dict[str, int]:
        """``{name: returncode}`` of the parts that have ended (negative: killed by that signal)."""
        codes = {name: part.returncode for name, part in self._parts.items()}
        return {name: code for name, code in codes.items() if code is not None}

    def stopped(self) -> list[str]:
        """The names of the running parts that are stopped (SIGSTOP) and not continued."""
        return [name for name, part in self._parts.items() if part.stopped]

    def send(self, name: str, sig: int) -> None:
        """Deliver ``sig`` to part ``name`` without waiting."""
        self._parts[name].signal(sig)

    @contextlib.contextmanager
    def paused(self, names: Sequence[str]) -> Iterator[None]:
        """Every part in ``names`` stopped (SIGSTOP) for the block, and continued (SIGCONT) after it, whatever
        the block raised.
        """
        for name in names:
            self.send(name, signal.SIGSTOP)
        try:
            yield
        finally:
            for name in names:
                self.send(name, signal.SIGCONT)

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Send ``sig``, wait up to ``timeout`` seconds, then SIGKILL; return the exit code."""
        self.send(name, sig)
        return self._wait_or_kill(self._parts[name], time.monotonic() + timeout)

    def kill(self, name: str) -> int:
        """SIGKILL part ``name`` and reap it; return its exit code (``-9`` unless it had ended)."""
        self.send(name, signal.SIGKILL)
        return self._parts[name].process.wait()

    def wait(self, name: str, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for part ``name`` to end; raises ``TimeoutError``."""
        try:
            return self._parts[name].process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"part {name!r} still running after {timeout} s") from None

    def wait_any_exit(self, timeout: float | None = None) -> tuple[str, int] | None:
        """Block until some part has ended and return ``(name, returncode)``; None after ``timeout`` s.

        Parts that had already ended count immediately, so callers that stop parts on purpose should
        look at ``exited()`` instead.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                done = self.exited()
                if done:
                    return next(iter(done.items()))
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                # Pumps notify at end of output; the cap also catches adopted parts that have no pump.
                self._changed.wait(0.5 if remaining is None else min(remaining, 0.5))

    def wait_for_line(self, name: str, predicate: Callable[[str], bool], timeout: float) -> str:
        """The first line of part ``name`` (printed already or yet to come) that satisfies ``predicate``.

        Raises ``TimeoutError`` after ``timeout`` seconds and ``RuntimeError`` when the part ends first.
        """
        deadline = time.monotonic() + timeout
        part = self._parts[name]
        seen = 0  # lines (counted since start) already tested
        with self._changed:
            while True:
                # Only the last TAIL_LINES lines are kept: a flood larger than that may hide a line.
                fresh = min(part.lines_total - seen, len(part.tail))
                for line in list(part.tail)[len(part.tail) - fresh :]:
                    if predicate(line):
                        return line
                seen = part.lines_total
                if part.returncode is not None and (part.pump is None or not part.pump.is_alive()):
                    raise RuntimeError(f"part {name!r} ended with {part.returncode} before the line appeared")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"part {name!r} printed no such line within {timeout} s")
                self._changed.wait(min(remaining, 0.5))

    def stop_all(self, timeout: float = 10.0) -> dict[str, int]:
        """SIGTERM every running part, SIGKILL those still running after ``timeout`` s; return exit codes."""
        parts = list(self._parts.values())
        for part in parts:
            part.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes = {part.name: self._wait_or_kill(part, deadline) for part in parts}
        self._join_pumps(parts, deadline=time.monotonic() + 2.0)
        return codes

    def kill_all(self) -> dict[str, int]:
        """SIGKILL every running part at once and reap them; return exit codes."""
        parts = list(self._parts.values())
        for part in parts:
            part.signal(signal.SIGKILL)
        codes = {part.name: part.process.wait() for part in parts}
        self._join_pumps(parts, deadline=time.monotonic() + 2.0)
        return codes

    def _wait_or_kill(self, part: Part, deadline: float) -> int:
        try:
            return part.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            part.signal(signal.SIGKILL)
            return part.process.wait()

    @staticmethod
    def _join_pumps(parts: Sequence[Part], *, deadline: float) -> None:
        # A grandchild that inherited the pipe may keep it open; do not hang on it.
        for part in parts:
            if part.pump is not None:
                part.pump.join(max(0.0, deadline - time.monotonic()))

    def _pump(self, part: Part) -> None:
        stream = part.process.stdout
        assert stream is not None
        log_file = self._open_log(part.name)
        try:
            for raw in stream:
                self._deliver(part, raw.decode("utf-8", "replace").rstrip("\r\n"), log_file)
        finally:
            stream.close()
            if log_file is not None:
                log_file.close()
            with self._changed:
                self._changed.notify_all()

    def _deliver(self, part: Part, line: str, log_file: IO[str] | None) -> None:
        with self._changed:
            part.tail.append(line)
            part.lines_total += 1
            self._changed.notify_all()
        if log_file is not None:
            log_file.write(line + "\n")
            log_file.flush()
        if self._sink is not None:
            try:
                self._sink(part.name, line)
            except Exception:  # a failing sink must not stop the pump: the child would block on a full pipe
                traceback.print_exc()

    def _open_log(self, name: str) -> IO[str] | None:
        if self._log_dir is None:
            return None
        return (self._log_dir / f"{name}.log").open("a", encoding="utf-8")
