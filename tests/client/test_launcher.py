"""The console script's guard while the command loads (docs/command-line.md: Command line): a Ctrl-C then is exit
130."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from chatexport import launcher


def test_a_ctrl_c_while_loading_exits_130_quietly(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        launcher._interrupted(signal.SIGINT, None)
    assert exited.value.code == 130
    assert capsys.readouterr().err == "chatexport: interrupted\n"


def test_the_console_script_runs_the_command_through_the_launcher() -> None:
    script = Path(sys.executable).parent / "chatexport"
    assert "from chatexport.launcher import main" in script.read_text()
    ran = subprocess.run([str(script), "export", "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0 and "CONVERSATION" in ran.stdout
