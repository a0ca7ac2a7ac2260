"""The README documents every setting with its default (README: Settings), every error code with its status
(README: Error codes), and keeps its two set-up commands.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.api.http.problems import CODES
from shared.settings import Settings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_every_setting_is_documented_with_its_default(name: str) -> None:
    default = Settings.model_fields[name].default
    shown = "none" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
    assert f"| `CHATEXPORT_{name.upper()}` | `{shown}` |" in README


def test_the_top_shows_make_run_and_make_test() -> None:
    top = README[: README.index("## ")]
    assert "make run" in top and "make test" in top


def test_the_error_code_table_lists_every_code_with_its_status() -> None:
    section = README[README.index("### Error codes") :]
    section = section[: section.index("\n## ")]
    rows = re.findall(r"^\| `([A-Z_]+)` \| (\d{3}) \|", section, flags=re.MULTILINE)
    documented = [(code, int(status)) for code, status in rows]
    assert len(documented) == len(dict(documented)), "a code is listed twice"
    assert dict(documented) == {code: status for code, (status, _) in CODES.items()}
