"""The runbook names every metric the parts serve, so that an alert on any of them has its explanation."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.reference import served_metrics

RUNBOOK = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
SERVED = [metric.name for metric in served_metrics()]


def test_the_parts_serve_metrics() -> None:
    assert len(SERVED) > 30


@pytest.mark.parametrize("name", SERVED)
def test_every_metric_is_explained_in_the_runbook(name: str) -> None:
    assert f"`{name}" in RUNBOOK
