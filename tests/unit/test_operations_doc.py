"""The runbook names every metric the parts serve, so that an alert on any of them has its explanation."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import REGISTRY

# Importing the parts registers their metrics in the default registry.
import services.api.app
import services.janitor.main
import services.relay.main
import services.worker.main

RUNBOOK = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
PARTS = (services.api.app, services.janitor.main, services.relay.main, services.worker.main)


def served_metrics() -> list[str]:
    """The names a scrape shows: counters with their ``_total``, other families as they are."""
    names = []
    for family in REGISTRY.collect():
        if family.name.startswith("chatexport_") and not family.name.startswith("chatexport_test_"):
            names.append(f"{family.name}_total" if family.type == "counter" else family.name)
    return sorted(names)


def test_the_parts_serve_metrics() -> None:
    assert len(served_metrics()) > 30


@pytest.mark.parametrize("name", served_metrics())
def test_every_metric_is_explained_in_the_runbook(name: str) -> None:
    assert f"`{name}" in RUNBOOK
