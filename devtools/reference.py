"""The documentation site's reference pages, generated from the code when the site is built so that they
cannot drift from it:

- ``reference/settings.md`` from ``shared.settings.Settings`` (each field's ``description`` and unit) and
  ``shared.settings.RULES``;
- ``reference/problems.md`` from ``services.api.http.problems.CODES`` and ``ABOUT_CODES``;
- ``reference/metrics.md`` from the prometheus-client registry once every part is loaded
  (``served_metrics``, which ``tests/monitoring/test_operations_doc.py`` also uses);
- ``reference/cli.md`` from the ``chatexport`` command's parser (``chatexport.cli.build_parser``);
- the endpoint table of ``api.md`` from ``shared.routes.ROUTES`` and the OpenAPI endpoints
  (``endpoint_table``), put in place of the page's ``ENDPOINTS_PLACEHOLDER`` line (``with_endpoint_table``).

Each ``*_page()`` returns one page's markdown, and ``generated_pages()`` all of them by their path under the
site's ``docs_dir``; ``docs/gen_reference.py`` writes them, and the API reference with its table, with
mkdocs-gen-files, and ``tests/project/test_reference.py`` checks them. Links point at the hand-written pages
beside ``reference/``.
Developer tooling: nothing the parts run imports this module.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from chatexport.cli import PARTS, build_parser
from services.api.http.problems import ABOUT_CODES, CODES
from services.api.openapi import ENDPOINTS
from shared.routes import ROUTES
from shared.settings import GROUPS, RULES, Settings

# The service's own metrics are named so; the client library's process and platform collectors are not.
METRIC_PREFIX = "chatexport_"
# Usage lines are wrapped as argparse wraps them, at a fixed width rather than the terminal's, so that the
# page is the same wherever the site is built.
USAGE_WIDTH = 100
# Package whose modules count a metric for every part alike (the monitoring endpoint, shared counters).
SHARED_PACKAGE = "shared"
# The hand-written page that holds the endpoint table, and its line that the site's build replaces with the table:
# where the markdown is read as it is, the line says where the table is.
ENDPOINTS_PAGE = "api.md"
ENDPOINTS_PLACEHOLDER = (
    "The table of every route is generated from `shared/routes.py` when the site is built (`make docs`)."
)
# Routes under it need a token with the admin scope (services.api.http.middlewares).
ADMIN_PREFIX = "/admin/"


def settings_page() -> str:
    """The Settings page: ``shared.settings.RULES``, then a section per group of ``shared.settings.GROUPS``
    (its docstring, the parts that read it, then a table of its settings in the group's order): each row the
    environment variable (``env_prefix`` and the name in capitals), its default as the variable would be
    written (``none`` for ``None``, ``true``/``false`` for a flag, secrets' development placeholders as they
    are; each row carries the anchor ``#chatexport_<name>``), its unit (``setting_unit``, blank when it has
    none) and its ``description``. Raises ``ValueError`` for a field without a description.
    """
    prefix = str(Settings.model_config.get("env_prefix", ""))
    sections = []
    for group in GROUPS:
        rows = []
        for name, field in group.model_fields.items():
            if not field.description:
                raise ValueError(f"the setting {name} has no description")
            variable = f"{prefix}{name}".upper()
            # An anchor per row, so that an operator can link to one setting: settings.md#chatexport_jwt_secret.
            cell = f'<a id="{variable.lower()}"></a>{_code(variable)}'
            rows.append([cell, _code(_shown_default(field.default)), setting_unit(name), field.description])
        title = group.__name__.removesuffix("Settings")
        readers = ", ".join(f"`{name}`" for name, part in PARTS.items() if issubclass(part.settings, group))
        table = _table(["setting", "default", "unit", "meaning"], rows)
        sections.append(f"## {title}\n\n{group.__doc__}\n\nRead by: {readers}.\n\n{table}")
    return "# Settings\n\n" + RULES + "\n\n" + "\n\n".join(sections)


# The units a setting's name gives (docs/reference/settings.md: Settings): durations in seconds, sizes in bytes.
UNITS_BY_SUFFIX = {"_seconds": "s", "_bytes": "bytes"}


def setting_unit(name: str) -> str:
    """The unit of the setting ``name`` (a field of ``shared.settings.Settings``): the one its name's suffix
    gives (``UNITS_BY_SUFFIX``), else its ``json_schema_extra["unit"]``, or ``""`` when it has none. Raises
    ``KeyError`` for an unknown name.
    """
    extra = Settings.model_fields[name].json_schema_extra
    for suffix, unit in UNITS_BY_SUFFIX.items():
        if name.endswith(suffix):
            return unit
    return str(extra.get("unit", "") if isinstance(extra, dict) else "")


def problems_page() -> str:
    """The problem codes page: ``ABOUT_CODES``, then one row per entry of ``CODES`` in its order (code,
    status, title, when it is answered). Raises ``ValueError`` for a code without a ``when`` text.
    """
    rows = []
    for code, meaning in CODES.items():
        if not meaning.when.strip():
            raise ValueError(f"the problem code {code} says not when it is answered")
        rows.append([_code(code), str(meaning.status), meaning.title, meaning.when])
    see_also = (
        "What each route answers is in the [API reference](../api.md); how an export itself fails is in"
        " [States and failure model](../states.md#states-and-failure-model)."
    )
    table = _table(["code", "status", "title", "when"], rows)
    return f"# Problem codes\n\n{ABOUT_CODES}\n\n{see_also}\n\n{table}"


@dataclass(frozen=True)
class ServedMetric:
    """One metric family every part's ``/metrics`` serves.

    ``name`` is the name a scrape shows (a counter's with its ``_total``); ``type`` prometheus-client's
    (``counter``, ``gauge``, ``histogram``, ...); ``labels`` the label names the code gives it (a histogram's
    ``le`` aside); ``help`` its help text. ``parts`` names the parts whose code counts it, in the order of
    ``chatexport.cli.PARTS``; empty when only shared code (``shared.*``) does, which then counts it in every
    part alike.
    """

    name: str
    type: str
    labels: tuple[str, ...]
    help: str
    parts: tuple[str, ...]


def served_metrics(registry: CollectorRegistry = REGISTRY) -> list[ServedMetric]:
    """Every ``chatexport_*`` metric family of ``registry``, by name, once every part is loaded.

    A part's process is started by the ``chatexport`` command, whose module (``chatexport.cli``) imports every
    part; this module imports it, so the default registry holds exactly what any part's ``/metrics`` serves.
    Which parts count a family is read from the modules that hold its metric object (or a labelled child of
    it) as a module attribute: a part's package (the package of its module in ``chatexport.cli.PARTS``) or
    ``shared``. A family that only other modules hold (a test's own counter) is left out. Raises
    ``LookupError`` for a family no module holds, since its parts cannot be told: define metrics at module
    level.
    """
    part_packages = {name: part.module.rpartition(".")[0] for name, part in PARTS.items()}
    holders = _metric_holders()
    served = []
    for family in registry.collect():
        if not family.name.startswith(METRIC_PREFIX):
            continue
        held = holders.get(family.name, [])
        if not held:
            raise LookupError(f"no module holds the metric {family.name}, so its parts cannot be told")
        modules = {module for module, _ in held}
        parts = tuple(part for part, package in part_packages.items() if any(_within(m, package) for m in modules))
        if not parts and not any(_within(module, SHARED_PACKAGE) for module in modules):
            continue
        # prometheus-client has no public accessor for a metric's label names; its objects keep them here. An
        # info metric's labels are its value, and its sample is named ``<name>_info``.
        if family.type == "info":
            labels, name = tuple(family.samples[0].labels), f"{family.name}_info"
        else:
            labels = tuple(held[0][1]._labelnames)
            name = f"{family.name}_total" if family.type == "counter" else family.name
        served.append(ServedMetric(name, family.type, labels, family.documentation, parts))
    return sorted(served, key=lambda metric: metric.name)


def metrics_page() -> str:
    """The metrics page: a section for the metrics shared code counts in every part, then one per part
    (``chatexport.cli.PARTS``) with the metrics its code counts (a metric counted by two parts is in both),
    each a table of name, type, labels and help text from ``served_metrics()``.
    """
    metrics = served_metrics()
    intro = (
        "Every part serves Prometheus metrics at `/metrics` on its monitoring port"
        " (`CHATEXPORT_METRICS_HOST:CHATEXPORT_METRICS_PORT`; see [Monitoring](../monitoring.md)). Each part's"
        " process is started by the `chatexport` command, which loads every part, so every `/metrics` lists"
        " every metric below, besides prometheus-client's own `process_*` and `python_*`; a metric moves only"
        " in the parts it is listed under. A counter is shown as a scrape names it, with `_total`; a histogram"
        " is served as its `_bucket` (with the label `le`), `_sum` and `_count` series. What each one means"
        " when it alerts, and what to do, is in the [runbook](../operations.md)."
    )
    sections = [f"# Metrics\n\n{intro}"]
    every_part = [metric for metric in metrics if not metric.parts]
    if every_part:
        sections.append(f"## Every part\n\nCounted by the code every part shares.\n\n{_metric_table(every_part)}")
    for part in PARTS:
        counted = [metric for metric in metrics if part in metric.parts]
        sections.append(f"## {part}\n\nCounted by the {part}'s code.\n\n{_metric_table(counted)}")
    return "\n\n".join(sections)


def cli_page() -> str:
    """The command-line reference: the ``chatexport`` command's usage, a table of every subcommand (nested
    ones as ``operations list``) and a section for each with its help text, usage line and arguments.

    The parser is built with no ``CHATEXPORT_*`` variable in the environment, so that a default read from
    the environment (``--token`` reads ``CHATEXPORT_TOKEN``) shows the built-in value, never the builder's.
    """
    with _without_environment("CHATEXPORT_"):
        parser = build_parser()
    commands = list(_subcommands(parser, parser.prog))
    intro = (
        "Every subcommand of `chatexport`, generated from its argument parser: its usage, arguments and help"
        " texts. What the commands are for, with examples, is on the [Command line](../command-line.md) page."
        " Every command also takes `-h` or `--help`, which prints its usage."
    )
    summary = _table(
        ["command", "what it does"],
        [[f"[`{prog}`](#{_anchor(prog)})", help_text] for prog, help_text, _ in commands],
    )
    sections = [f"# Command-line reference\n\n{intro}\n\n{_usage_block(parser)}\n\n{summary}"]
    for prog, help_text, sub in commands:
        level = "#" * (prog.count(" ") + 1)
        sections.append(f"{level} {prog}\n\n{help_text}\n\n{_usage_block(sub)}\n\n{_arguments(sub)}")
    return "\n\n".join(sections)


def endpoint_table() -> str:
    """The API reference's table of every route of ``shared.routes.ROUTES``, in its order: the method and the
    path (with the query parameters of a documented route's query model, as ``?name=&...``), the token it
    needs (none for a public route, one with the admin scope under ``/admin/``, else a bearer token) and what
    it does: a documented route's ``Endpoint`` summary, any other route's own ``summary``. A sentence after
    it names the GET routes that answer no HEAD. Raises ``ValueError`` for a route without a summary.
    """
    rows = []
    for route in ROUTES:
        endpoint = ENDPOINTS.get(route.name)
        summary = endpoint.summary if endpoint is not None else route.summary
        if not summary:
            raise ValueError(f"the route {route.name} has no summary")
        names = (
            [field.alias or name for name, field in endpoint.query.model_fields.items()]
            if endpoint and endpoint.query
            else []
        )
        query = "?" + "&".join(f"{name}=" for name in names) if names else ""
        token = "none" if route.public else "admin scope" if route.path.startswith(ADMIN_PREFIX) else "bearer"
        rows.append([_code(f"{route.method} {route.path}{query}"), token, summary[0].upper() + summary[1:]])
    table = _table(["method and path", "token", "what it does"], rows)
    headless = ", ".join(
        _code(f"{route.method} {route.path}") for route in ROUTES if route.method == "GET" and not route.head
    )
    note = f"Every `GET` route also answers `HEAD` (the same status and headers, no body) but {headless}."
    return f"{table}\n\n{note}"


def with_endpoint_table(page: str) -> str:
    """``page`` (the markdown of ``ENDPOINTS_PAGE``) with its ``ENDPOINTS_PLACEHOLDER`` line replaced by
    ``endpoint_table()``. Raises ``ValueError`` unless the page holds that line exactly once.
    """
    lines = page.split("\n")
    if lines.count(ENDPOINTS_PLACEHOLDER) != 1:
        raise ValueError(f"{ENDPOINTS_PAGE} must hold the line {ENDPOINTS_PLACEHOLDER!r} once")
    lines[lines.index(ENDPOINTS_PLACEHOLDER)] = endpoint_table()
    return "\n".join(lines)


# Each generated page's path under the site's docs_dir -> the function writing it.
PAGES: dict[str, Callable[[], str]] = {
    "reference/settings.md": settings_page,
    "reference/problems.md": problems_page,
    "reference/metrics.md": metrics_page,
    "reference/cli.md": cli_page,
}


def generated_pages() -> dict[str, str]:
    """Every reference page: its path under the site's ``docs_dir`` (a key of ``PAGES``) -> its markdown.
    Raises what the page functions raise (``ValueError``, ``LookupError``) when the code lacks a text.
    """
    return {path: page() for path, page in PAGES.items()}


def _shown_default(default: object) -> str:
    if default is None:
        return "none"
    if isinstance(default, bool):
        return str(default).lower()
    return str(default)


def _metric_holders() -> dict[str, list[tuple[str, MetricWrapperBase]]]:
    """Family name -> ``(module name, metric object)`` for every metric object a loaded module holds."""
    holders: dict[str, list[tuple[str, MetricWrapperBase]]] = {}
    for module_name, module in list(sys.modules.items()):
        for value in list(getattr(module, "__dict__", {}).values()):
            if isinstance(value, MetricWrapperBase):
                for family in value.describe():
                    holders.setdefault(family.name, []).append((module_name, value))
    return holders


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def _metric_table(metrics: list[ServedMetric]) -> str:
    rows = [
        [_code(metric.name), metric.type, ", ".join(_code(label) for label in metric.labels), metric.help]
        for metric in metrics
    ]
    return _table(["metric", "type", "labels", "help"], rows)


def _subcommands(parser: argparse.ArgumentParser, prog: str) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """``(full command, help text, parser)`` for each subcommand of ``parser``, depth first, in the order
    they were added.
    """
    # argparse offers no public way to walk its subparsers; sphinx-argparse and others read these.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                full = f"{prog} {name}"
                yield full, helps.get(name, ""), sub
                yield from _subcommands(sub, full)


def _usage_block(parser: argparse.ArgumentParser) -> str:
    formatter = _formatter(parser)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return f"```text\n{formatter.format_help().strip()}\n```"


def _arguments(parser: argparse.ArgumentParser) -> str:
    """The table of ``parser``'s own arguments (not ``--help``, not its subcommands), as its help shows them."""
    formatter = _formatter(parser)
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.option_strings:
            names = ", ".join(_code(option) for option in action.option_strings)
            # The helpers argparse's own help uses to write an argument's value and expand %(default)s.
            value = formatter._format_args(action, action.dest.upper()) if action.nargs != 0 else ""
        else:
            names = _code(formatter._format_args(action, action.dest))
            value = ""
        help_text = formatter._expand_help(action) if action.help else ""
        if action.required and action.option_strings:
            help_text = f"required; {help_text}" if help_text else "required"
        rows.append([names, _code(value) if value else "", help_text])
    if not rows:
        has_subcommands = any(isinstance(action, argparse._SubParsersAction) for action in parser._actions)
        return "No arguments but its subcommands, below." if has_subcommands else "No arguments."
    return _table(["argument", "value", "help"], rows)


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    # argparse's own formatter (the one the parsers use; usage lines are written alike by all of them).
    return argparse.HelpFormatter(prog=parser.prog, width=USAGE_WIDTH)


@contextlib.contextmanager
def _without_environment(prefix: str) -> Iterator[None]:
    saved = {name: value for name, value in os.environ.items() if name.startswith(prefix)}
    for name in saved:
        del os.environ[name]
    try:
        yield
    finally:
        os.environ.update(saved)


def _anchor(heading: str) -> str:
    # The slug Python-Markdown's toc extension gives a heading of words, digits and spaces.
    return heading.lower().replace(" ", "-")


def _code(text: str) -> str:
    """``text`` as an inline code span; a text with a backtick is fenced with two."""
    if not text:
        return '`""`'
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table; ``|`` and line breaks in a cell are escaped so that each row stays one row."""
    lines = [_row(header), "|" + "---|" * len(header)]
    lines.extend(_row(row) for row in rows)
    return "\n".join(lines)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"
