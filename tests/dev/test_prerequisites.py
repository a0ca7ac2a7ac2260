"""The check ``make test`` runs first (docs/development.md: Development, Prerequisites): it names each program this
host lacks with the Debian package to install and exits non-zero, and says nothing when all are there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools import prerequisites
from devtools.prerequisites import Prerequisite

ROOT = Path(__file__).resolve().parents[2]


def test_a_path_without_pg_dump_is_named_with_its_package_and_fails(tmp_path: Path) -> None:
    checked = subprocess.run(
        [sys.executable, "-m", "devtools.prerequisites"],
        cwd=ROOT,
        env={**os.environ, "PATH": str(tmp_path), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 1, checked
    assert "  pg_dump (package postgresql-client), for the schema snapshot's test\n" in checked.stderr
    assert "apt-get install -y " in checked.stderr and "postgresql-client" in checked.stderr.splitlines()[-1]


def test_only_what_is_missing_is_reported_each_package_once(capsys: pytest.CaptureFixture[str]) -> None:
    def nowhere() -> Path | None:
        return None

    present = Prerequisite("python", "python3", "everything", lambda: Path(sys.executable))
    absent = [Prerequisite(name, "a-package", "a test", nowhere) for name in ("one-tool", "other-tool")]
    assert prerequisites.main([present]) == 0
    assert capsys.readouterr().err == ""
    assert prerequisites.main([present, *absent]) == 1
    report = capsys.readouterr().err
    assert "one-tool (package a-package)" in report and "other-tool (package a-package)" in report
    assert "python" not in report
    assert report.splitlines()[-1].endswith("apt-get install -y a-package")


def test_the_makefile_checks_before_linting() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "\ntest: prerequisites lint docs\n" in makefile
    assert "\tpython -m devtools.prerequisites\n" in makefile.replace("$(BIN)/", "")


@pytest.mark.parametrize("page", ["README.md", "docs/tutorial.md", "docs/development.md"])
def test_the_set_up_pages_name_every_prerequisite(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    for prerequisite in prerequisites.PREREQUISITES:
        assert f"`{prerequisite.name}`" in text or f"`{prerequisite.package}`" in text, prerequisite.name
