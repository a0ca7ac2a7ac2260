"""The installed pytest and pytest-xdist keep an ``xdist_group`` on one process under ``--dist loadgroup``, as
``make test`` needs: the tests that hold the session's end-to-end system share one, and each cluster group of
``make test-clusters`` runs on one (docs/development.md: Where the time goes). Some pairs of versions drop the
groups without a word and spread the tests over every process (pytest-dev/pytest-xdist#1386).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPED = """
import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("n", range(6))
def test_grouped(n):
    assert n >= 0
"""

UNGROUPED = """
import pytest


@pytest.mark.parametrize("n", range(6))
def test_free(n):
    assert n >= 0
"""

# "[gw1] [ 50%] PASSED test_one.py::test_grouped[3]@together" in a verbose run
RESULT = re.compile(r"^\[(gw\d+)\] .*? PASSED (\S+)\s*$", re.MULTILINE)


def test_one_group_runs_on_one_process(tmp_path: Path) -> None:
    """Two files of one group, among free tests on two processes: the group's twelve tests share a process."""
    (tmp_path / "test_one.py").write_text(GROUPED)
    (tmp_path / "test_two.py").write_text(GROUPED)
    for name in ("test_three.py", "test_four.py"):
        (tmp_path / name).write_text(UNGROUPED)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    results = RESULT.findall(run.stdout)
    assert len(results) == 24, run.stdout
    grouped = {process for process, test in results if "test_grouped" in test}
    assert len(grouped) == 1, f"the group ran on {sorted(grouped)}:\n{run.stdout}"
