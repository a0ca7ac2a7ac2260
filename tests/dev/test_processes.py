"""ProcessGroup: starting, signalling, killing and reaping real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.processes import ProcessGroup

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable

# A child that says it is ready only after it ignores SIGTERM, so the test cannot race its set-up.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready'); time.sleep(600)"
SLEEPER = "import time; print('ready'); time.sleep(600)"


@pytest.fixture
def group(tmp_path: Path) -> Iterator[ProcessGroup]:
    with ProcessGroup(log_dir=tmp_path / "logs") as processes:
        yield processes


def gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie waiting for a reaper that is not us)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (FileNotFoundError, ProcessLookupError):
        return True


def wait_until_gone(pid: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not gone(pid):
        assert time.monotonic() < deadline, f"pid {pid} still running after {timeout} s"
        time.sleep(0.05)  # polling another process's state


def test_output_goes_to_the_tail_the_log_file_and_the_sink(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []
    with ProcessGroup(sink=lambda name, line: seen.append((name, line)), log_dir=tmp_path) as group:
        group.start("talker", [PY, "-c", "import sys; print('out 1'); print('err 2', file=sys.stderr); print('ü')"])
        assert group.wait("talker", 30) == 0
        assert group.wait_for_line("talker", lambda line: line == "ü", timeout=10) == "ü"
        group.stop_all()
    assert sorted(seen) == sorted([("talker", "out 1"), ("talker", "err 2"), ("talker", "ü")])
    assert sorted((tmp_path / "talker.log").read_text(encoding="utf-8").splitlines()) == ["err 2", "out 1", "ü"]
    assert group.exited() == {"talker": 0} and group.pids() == {}


def test_children_get_the_environment_given_and_the_parent_pid(group: ProcessGroup) -> None:
    script = "import os; print(os.environ['ONLY'], os.environ['CHATEXPORT_PARENT_PID'], 'HOME' in os.environ)"
    group.start("env", [PY, "-c", script], {"ONLY": "this", "PATH": os.environ["PATH"]})
    line = group.wait_for_line("env", lambda line: line.startswith("this"), timeout=30)
    assert line == f"this {os.getpid()} False"


def test_stop_all_escalates_to_sigkill_after_the_timeout(group: ProcessGroup) -> None:
    group.start("stubborn", [PY, "-c", STUBBORN])
    group.start("polite", [PY, "-c", SLEEPER])
    for name in ("stubborn", "polite"):
        group.wait_for_line(name, lambda line: line == "ready", timeout=30)
    started = time.monotonic()
    codes = group.stop_all(timeout=1.0)
    assert codes == {"stubborn": -signal.SIGKILL, "polite": -signal.SIGTERM}
    assert time.monotonic() - started < 10


def test_kill_one_part_leaves_the_others_and_the_name_can_be_restarted(group: ProcessGroup) -> None:
    first = group.start("a", [PY, "-c", SLEEPER])
    group.start("b", [PY, "-c", SLEEPER])
    with pytest.raises(ValueError, match="already running"):
        group.start("a", [PY, "-c", SLEEPER])

    assert group.kill("a") == -signal.SIGKILL
    assert set(group.pids()) == {"b"}
    assert group.exited() == {"a": -signal.SIGKILL}
    assert group.wait_any_exit(timeout=0.1) == ("a", -signal.SIGKILL)

    second = group.start("a", [PY, "-c", SLEEPER])
    assert second.pid != first.pid and set(group.pids()) == {"a", "b"}


def test_wait_any_exit_wakes_when_a_part_ends(group: ProcessGroup) -> None:
    group.start("sleeper", [PY, "-c", SLEEPER])
    group.start("quick", [PY, "-c", "import sys; sys.exit(3)"])
    assert group.wait_any_exit(timeout=30) == ("quick", 3)


def test_wait_any_exit_times_out_while_all_run(group: ProcessGroup) -> None:
    group.start("sleeper", [PY, "-c", SLEEPER])
    started = time.monotonic()
    assert group.wait_any_exit(timeout=0.3) is None
    assert time.monotonic() - started >= 0.3


def test_wait_for_line_fails_when_the_part_ends_first(group: ProcessGroup) -> None:
    group.start("short", [PY, "-c", "print('bye')"])
    with pytest.raises(RuntimeError, match="ended with 0"):
        group.wait_for_line("short", lambda line: line == "never", timeout=30)


def test_a_signal_reaches_what_the_part_started(group: ProcessGroup) -> None:
    script = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        "print(p.pid, flush=True); time.sleep(600)"
    )
    group.start("parent", [PY, "-c", script])
    grandchild = int(group.wait_for_line("parent", str.isdigit, timeout=30))
    assert group.stop("parent", timeout=10) == -signal.SIGTERM
    wait_until_gone(grandchild)


def test_adopted_process_is_stopped_with_the_group(group: ProcessGroup) -> None:
    process = subprocess.Popen([PY, "-c", "import time; time.sleep(600)"])
    group.adopt("outsider", process)
    assert group.pids() == {"outsider": process.pid}
    assert group.stop_all(timeout=10) == {"outsider": -signal.SIGTERM}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_parts_die_with_a_supervisor_that_was_sigkilled() -> None:
    # The supervisor: a process with a ProcessGroup whose part follows it like `chatexport <part>` does.
    part = (
        "; ".join(
            ("from shared.lifecycle import follow_parent", "import os, time", "follow_parent()", "print(os.getpid())")
        )
        + "; time.sleep(600)"
    )
    supervisor = textwrap.dedent(f"""
        import sys
        from devtools.processes import ProcessGroup
        group = ProcessGroup(sink=lambda name, line: print(line, flush=True))
        group.start("part", [sys.executable, "-c", {part!r}])
        group.wait("part", 600)
    """)
    process = subprocess.Popen([PY, "-c", supervisor], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        part_pid = int(process.stdout.readline())
        assert not gone(part_pid)
    finally:
        process.kill()
        process.wait()
    wait_until_gone(part_pid)
