"""The README documents every setting with its default (contract 7), and keeps its two set-up commands."""

from __future__ import annotations

from pathlib import Path

import pytest

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
