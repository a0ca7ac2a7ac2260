"""The README is a short front page: its two set-up commands at the top, at most about 150 lines, links
that lead into the docs site, and every section it used to hold kept on a page of the site (the
settings, the problem codes, the metrics and the command line as pages generated from the code:
tests/project/test_reference.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chatexport.client.commands import EXIT_ENDED_BADLY, EXIT_REFUSED
from shared.tracing import attributes

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")

# Each heading of the README before the docs site -> the page that
# holds it now, under the same heading. The generated pages are checked by test_reference.py instead.
MOVED = {
    "How it works": "docs/architecture.md",
    "Calling the API": "docs/tutorial.md",
    "API reference": "docs/api.md",
    "Error codes": "docs/api.md",
    "Retention periods": "docs/retention.md",
    "Orphan objects and uploads": "docs/retention.md",
    "States and failure model": "docs/states.md",
    "Attempts": "docs/states.md",
    "Monitoring": "docs/monitoring.md",
    "Command line": "docs/command-line.md",
    "Command-line client": "docs/command-line.md",
    "Deployment and scaling": "docs/deploy.md",
    "Which parts may run as several replicas": "docs/deploy.md",
    "Rolling deploys": "docs/deploy.md",
    "The end-to-end tests start the system from the compose file": "docs/deploy.md",
    "Development": "docs/development.md",
    "Today's schema": "docs/development.md",
    "The fault harness": "docs/development.md",
    "Benchmark": "docs/benchmark.md",
    "Cancel and takeover latency": "docs/benchmark.md",
}


def test_the_top_shows_make_run_and_make_test() -> None:
    top = README[: README.index("## ")]
    assert "make run" in top and "make test" in top


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= 150


@pytest.mark.parametrize("target", sorted(set(re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README))))
def test_every_link_of_the_readme_leads_to_a_file(target: str) -> None:
    assert (ROOT / target).is_file()


@pytest.mark.parametrize(("heading", "page"), MOVED.items())
def test_every_old_section_has_a_page(heading: str, page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    assert re.search(rf"^#+ {re.escape(heading)}$", text, flags=re.MULTILINE)


def test_the_readme_names_every_span_attribute_of_ours() -> None:
    # Dashboards query these names, so the front page states them (docs/monitoring.md: Monitoring, Traces).
    names = {value for name, value in vars(attributes).items() if name.isupper() and isinstance(value, str)}
    shown = set(re.findall(r"`(chatexport\.[a-z_]+)`", README))
    assert names - {attributes.ROOT_MARKER} == shown


def test_the_readme_gives_the_exit_codes_of_a_schedule_fetch() -> None:
    # A refused download outranks an expired run (chatexport/client/schedule_commands.py; docs/schedule-exports.md:
    # Fetching the files).
    text = " ".join(README.split())
    assert f"the fetch exits {EXIT_ENDED_BADLY}, but {EXIT_REFUSED} if the API refused a run's download" in text
