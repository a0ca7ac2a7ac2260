"""The site's reference pages are generated from the code (devtools/reference.py) and say all of it: every
setting with its description, default and unit, every problem code with when it is answered, every metric
the parts serve under the parts that count it, every subcommand and option of the command line; and each
page is markdown that renders, with one H1.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import runpy
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import markdown
import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from chatexport.cli import PARTS, build_parser
from devtools import reference
from services.api.http.problems import CODES
from services.worker.chunked import plan as chunked
from shared.routes import ROUTES, Route
from shared.settings import MAX_CHUNKS, MIN_JWT_SECRET_BYTES, RULES, Settings
from tests.support import documented

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def pages() -> dict[str, str]:
    """The generated pages, made once, when a test first asks (a generator's error then fails that test)."""
    return reference.generated_pages()


# A metric only this module holds: served_metrics must leave it out (it is no part's).
PROBE_REGISTRY = CollectorRegistry()
PROBE = Counter("chatexport_reference_probe", "Held by a test module only.", registry=PROBE_REGISTRY)


def section(page: str, heading: str) -> str:
    """The text under ``heading`` (a whole heading line) up to the next heading of its level or above."""
    level = len(heading) - len(heading.lstrip("#"))
    start = page.index(f"\n{heading}\n") + len(heading) + 2
    following = re.compile(rf"^#{{1,{level}}} ", flags=re.MULTILINE)
    found = following.search(page, start)
    return page[start : found.start() if found else len(page)]


def tables(page: str) -> list[list[str]]:
    """Each table of ``page`` as its lines (runs of lines starting with ``|`` outside fenced code)."""
    found: list[list[str]] = []
    fenced = False
    current: list[str] = []
    for line in [*page.splitlines(), ""]:
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("|"):
            current.append(line)
            continue
        if current:
            found.append(current)
            current = []
    return found


def cells(row: str) -> list[str]:
    """The cells of a table row, split at the pipes that are not escaped."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


# -- settings


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_every_setting_has_a_description(name: str) -> None:
    description = Settings.model_fields[name].description
    assert description and description.strip()


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_a_duration_is_in_seconds_and_a_size_in_bytes(name: str) -> None:
    if name.endswith("_seconds"):
        assert reference.setting_unit(name) == "s"
    elif name.endswith("_bytes"):
        assert reference.setting_unit(name) == "bytes"


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_the_settings_page_shows_every_setting_with_its_default_unit_and_meaning(name: str) -> None:
    field = Settings.model_fields[name]
    default = field.default
    shown = "none" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
    cell = f'<a id="chatexport_{name}"></a>`CHATEXPORT_{name.upper()}`'
    row = f"| {cell} | `{shown}` | {reference.setting_unit(name)} | {field.description} |"
    assert row in pages()["reference/settings.md"]


def test_the_settings_page_lists_the_settings_in_the_class_order_and_states_the_rules() -> None:
    page = pages()["reference/settings.md"]
    listed = re.findall(
        r"^\| <a id=\"chatexport_[a-z0-9_]+\"></a>`CHATEXPORT_([A-Z0-9_]+)` \|", page, flags=re.MULTILINE
    )
    assert listed == [name.upper() for name in Settings.model_fields]
    assert RULES in page
    # The rules quote the limit the check applies, not a copy of it.
    assert f"shorter than {MIN_JWT_SECRET_BYTES} bytes" in RULES


def test_a_placeholder_secret_is_shown_as_today() -> None:
    page = pages()["reference/settings.md"]
    assert '<a id="chatexport_jwt_secret"></a>`CHATEXPORT_JWT_SECRET` | `dev-only-insecure-secret-change-me` |' in page
    assert '<a id="chatexport_webhook_proxy_url"></a>`CHATEXPORT_WEBHOOK_PROXY_URL` | `none` | URL |' in page


def test_the_chunk_cap_the_pages_quote_is_the_one_the_worker_plans_with() -> None:
    assert chunked.MAX_CHUNKS == MAX_CHUNKS
    assert f"(more, when an export would otherwise have over {MAX_CHUNKS:,} chunks)" in pages()["reference/settings.md"]
    assert f"An export never has more than {MAX_CHUNKS:,} chunks" in documented("chunks.md")


# -- problem codes


@pytest.mark.parametrize("code", list(CODES))
def test_every_problem_code_says_when_it_is_answered(code: str) -> None:
    meaning = CODES[code]
    assert meaning.when.strip()
    assert f"| `{code}` | {meaning.status} | {meaning.title} | {meaning.when} |" in pages()["reference/problems.md"]


def test_the_problem_codes_page_lists_each_code_once() -> None:
    listed = re.findall(r"^\| `([A-Z_]+)` \| (\d{3}) \|", pages()["reference/problems.md"], flags=re.MULTILINE)
    assert [(code, int(status)) for code, status in listed] == [(code, m.status) for code, m in CODES.items()]


# -- metrics


def test_served_metrics_are_every_chatexport_family_of_the_registry() -> None:
    # chatexport.cli is imported above, so the default registry holds what every part serves.
    # The names of their samples: a counter's end in _total, an info metric's in _info.
    suffixes = {"counter": "_total", "info": "_info"}
    registered = {
        family.name + suffixes.get(family.type, "")
        for family in REGISTRY.collect()
        if family.name.startswith("chatexport_") and not family.name.startswith("chatexport_test_")
    }
    served = reference.served_metrics()
    assert len(served) > 30
    assert [metric.name for metric in served] == sorted(registered)


def test_a_metric_of_a_part_is_counted_by_that_part() -> None:
    served = {metric.name: metric for metric in reference.served_metrics()}
    for name, metric in served.items():
        named_for = [part for part in PARTS if name.startswith(f"chatexport_{part}_")]
        assert set(named_for) <= set(metric.parts), name
    assert served["chatexport_http_requests_total"].parts == ("api",)
    assert served["chatexport_http_requests_total"].labels == ("method", "route", "status")
    assert served["chatexport_cancellations_finished_total"].parts == ("worker", "janitor")
    assert served["chatexport_metrics_refresh_failures_total"].parts == ()


def test_a_metric_held_only_outside_the_parts_is_left_out_and_one_held_nowhere_is_refused() -> None:
    assert reference.served_metrics(PROBE_REGISTRY) == []
    registry = CollectorRegistry()
    Counter("chatexport_reference_unheld", "Held by no module.", registry=registry)
    with pytest.raises(LookupError, match="chatexport_reference_unheld"):
        reference.served_metrics(registry)


@pytest.mark.parametrize("metric", reference.served_metrics(), ids=lambda metric: metric.name)
def test_every_metric_is_on_the_metrics_page_under_each_part_that_counts_it(metric: reference.ServedMetric) -> None:
    page = pages()["reference/metrics.md"]
    headings = [f"## {part}" for part in metric.parts] or ["## Every part"]
    for heading in headings:
        rows = [cells(row) for table in tables(section(page, heading)) for row in table[2:]]
        assert [metric.type, metric.help] in [[row[1], row[3]] for row in rows if row[0] == f"`{metric.name}`"]
    assert page.count(f"| `{metric.name}` |") == len(headings)


# -- command line


def commands(parser: argparse.ArgumentParser, prog: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``(full command, parser)`` for every subcommand, nested ones too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prog} {name}", sub
                yield from commands(sub, f"{prog} {name}")


COMMANDS = list(commands(build_parser(), "chatexport"))


def test_the_command_line_has_nested_subcommands() -> None:
    names = [prog for prog, _ in COMMANDS]
    assert {"chatexport api", "chatexport token", "chatexport operations download"} <= set(names)


@pytest.mark.parametrize(("prog", "parser"), COMMANDS, ids=[prog for prog, _ in COMMANDS])
def test_every_subcommand_and_option_is_on_the_cli_page(prog: str, parser: argparse.ArgumentParser) -> None:
    page = pages()["reference/cli.md"]
    heading = f"{'#' * (prog.count(' ') + 1)} {prog}"
    text = section(page, heading)
    assert f"[`{prog}`](#{prog.replace(' ', '-')})" in page
    assert f"```text\nusage: {prog} " in text
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.option_strings:
            shown = ", ".join(f"`{option}`" for option in action.option_strings)
        else:
            shown = f"`{action.metavar or action.dest}"
        assert f"| {shown}" in text, (prog, action.dest)
        if action.help and "%(" not in action.help:
            assert action.help in text, (prog, action.dest)


def test_the_cli_page_shows_no_default_taken_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATEXPORT_TOKEN", "token-from-the-builders-shell")
    monkeypatch.setenv("CHATEXPORT_API_URL", "http://builder.invalid:1")
    page = reference.cli_page()
    assert "token-from-the-builders-shell" not in page and "builder.invalid" not in page
    assert "else http://127.0.0.1:8080" in page
    assert os.environ["CHATEXPORT_TOKEN"] == "token-from-the-builders-shell", "the environment is put back"


# -- every page


@pytest.mark.parametrize("path", list(reference.PAGES))
def test_each_page_is_markdown_with_one_h1_and_whole_tables(path: str) -> None:
    page = pages()[path]
    assert page.count("```") % 2 == 0, "a fenced block is left open"
    headings = [line for line in _outside_fences(page) if re.match(r"#+ ", line)]
    assert [line for line in headings if line.startswith("# ")] == [headings[0]]
    found = tables(page)
    assert found, "no table"
    for table in found:
        width = len(cells(table[0]))
        assert re.fullmatch(r"\|(---\|)+", table[1]) and len(cells(table[1])) == width
        assert all(len(cells(row)) == width for row in table), table[0]
    html = markdown.markdown(page, extensions=["tables", "fenced_code", "toc"])
    assert html.count("<h1") == 1
    assert html.count("<table>") == len(found)
    ids = set(re.findall(r' id="([^"]+)"', html))
    assert set(re.findall(r"\]\(#([^)]+)\)", page)) <= ids, "a link to a heading the page has not"


def test_the_generator_script_writes_every_page(monkeypatch: pytest.MonkeyPatch) -> None:
    written: dict[str, str] = {}

    class Page:
        def __init__(self, path: str) -> None:
            self.path = path

        def __enter__(self) -> Page:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def write(self, text: str) -> None:
            written[self.path] = written.get(self.path, "") + text

    def open_page(path: str, mode: str) -> Any:
        # A page of docs/ is read as it is; what is written is kept.
        return (ROOT / "docs" / path).open(encoding="utf-8") if mode == "r" else Page(path)

    stub = types.ModuleType("mkdocs_gen_files")
    stub.open = open_page  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mkdocs_gen_files", stub)
    runpy.run_path(str(ROOT / "docs" / "gen_reference.py"))
    assert written == {**pages(), reference.ENDPOINTS_PAGE: api_reference()}


# -- the endpoint table of the API reference


def api_reference() -> str:
    """The API reference as the site shows it, with its endpoint table in place."""
    return reference.with_endpoint_table((ROOT / "docs" / reference.ENDPOINTS_PAGE).read_text(encoding="utf-8"))


@pytest.mark.parametrize("route", ROUTES, ids=lambda route: route.name)
def test_the_endpoint_table_lists_every_route(route: Route) -> None:
    page = api_reference()
    rows = [cells(row) for table in tables(section(page, "## Endpoints")) for row in table[2:]]
    shown = [row for row in rows if re.fullmatch(rf"`{re.escape(f'{route.method} {route.path}')}(\?[^`]*)?`", row[0])]
    assert len(shown) == 1, rows
    assert shown[0][2] and shown[0][1] == (
        "none" if route.public else "admin scope" if route.name.startswith("admin") else "bearer"
    )
    assert reference.ENDPOINTS_PLACEHOLDER not in page


def test_the_table_replaces_one_placeholder_line_and_refuses_a_page_without_it() -> None:
    source = (ROOT / "docs" / reference.ENDPOINTS_PAGE).read_text(encoding="utf-8")
    assert source.splitlines().count(reference.ENDPOINTS_PLACEHOLDER) == 1
    assert reference.with_endpoint_table(source) == source.replace(
        reference.ENDPOINTS_PLACEHOLDER, reference.endpoint_table()
    )
    with pytest.raises(ValueError, match="must hold the line"):
        reference.with_endpoint_table(source.replace(reference.ENDPOINTS_PLACEHOLDER, ""))
    with pytest.raises(ValueError, match="must hold the line"):
        reference.with_endpoint_table(f"{source}\n{reference.ENDPOINTS_PLACEHOLDER}\n")


def test_a_route_without_a_summary_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference, "ROUTES", (*ROUTES, Route("adminProbe", "GET", "/admin/probe")))
    with pytest.raises(ValueError, match="adminProbe"):
        reference.endpoint_table()


def _outside_fences(page: str) -> Iterator[str]:
    fenced = False
    for line in page.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and not line.startswith("```"):
            yield line
