"""A pytest plugin that says where a run's time goes: seconds by test folder (setup, call and teardown of its
tests) and by fixture (the setups each fixture paid, by scope), printed as Markdown tables at the end of the
run (docs/development.md: Where the time goes). Enabled with ``-p devtools.test_times --time-table``; under
pytest-xdist the fixture times travel from each worker in the reports' ``user_properties``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Generator
from typing import Any

import pytest

_FIXTURE_PROPERTY = "fixture-setup-seconds"

# Fixture setups this process ran: (fixture name, scope, seconds), in order; each test's setup takes its share.
_setups: list[tuple[str, str, float]] = []
_by_folder: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # folder -> [tests, seconds]
_by_fixture: defaultdict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--time-table", action="store_true", help="print the run's time by test folder and fixture")


# The seconds of setups that ran inside each setup still running: a fixture that asks for another with
# ``request.getfixturevalue`` sets it up inside its own, and each is counted its own time only.
_inner: list[float] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Generator[None]:
    start = time.perf_counter()
    _inner.append(0.0)
    yield
    elapsed = time.perf_counter() - start
    own = elapsed - _inner.pop()
    if _inner:
        _inner[-1] += elapsed
    _setups.append((fixturedef.argname, fixturedef.scope, own))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None]:
    first = len(_setups)
    yield
    # pytest sets up the fixtures a fixture names as arguments before its own setup hook runs.
    item.user_properties.append((_FIXTURE_PROPERTY, _setups[first:]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    folder = report.nodeid.split("::")[0].rsplit("/", 1)[0]
    tally = _by_folder[folder]
    tally[1] += report.duration
    if report.when == "setup":
        tally[0] += 1
        for name, value in report.user_properties:
            if name == _FIXTURE_PROPERTY:
                setups: list[tuple[str, str, float]] = value  # type: ignore[assignment]  # written above
                for fixture, scope, seconds in setups:
                    _by_fixture[(fixture, scope)][0] += 1
                    _by_fixture[(fixture, scope)][1] += seconds


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not config.getoption("--time-table") or not _by_folder:
        return
    write = terminalreporter.write_line
    total = sum(seconds for _, seconds in _by_folder.values())
    terminalreporter.section("where the time goes")
    write("| folder | tests | seconds | share |")
    write("|---|---:|---:|---:|")
    for folder, (tests, seconds) in sorted(_by_folder.items(), key=lambda entry: -entry[1][1]):
        write(f"| {folder} | {tests:.0f} | {seconds:.1f} | {seconds / total:.0%} |")
    write("")
    write("| fixture (scope) | setups | seconds |")
    write("|---|---:|---:|")
    ranked = sorted(_by_fixture.items(), key=lambda entry: -entry[1][1])
    for (fixture, scope), (setups, seconds) in ranked[:25]:
        write(f"| {fixture} ({scope}) | {setups:.0f} | {seconds:.1f} |")
