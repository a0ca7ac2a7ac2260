"""A ``conftest.py`` holds fixtures only and no module imports one: helpers live in ``tests/support/``
(docs/development.md: Development). Importing a conftest runs it a second time under another name, so its fixtures and
hooks would exist twice.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def conftest_imports(source: str) -> list[str]:
    """The modules named ``conftest`` (absolute or relative) that Python ``source`` imports."""
    named: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            named += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            named += [module] + [f"{module}.{alias.name}" for alias in node.names]
    return [name for name in named if name.rsplit(".", 1)[-1] == "conftest"]


@pytest.mark.parametrize(
    "source",
    ["from tests.conftest import wait_for", "from . import conftest", "import tests.faults.conftest"],
)
def test_the_check_sees_a_conftest_import(source: str) -> None:
    assert conftest_imports(source)


def test_no_test_module_imports_a_conftest() -> None:
    offenders = {
        str(path.relative_to(TESTS)): found
        for path in sorted(TESTS.rglob("*.py"))
        if (found := conftest_imports(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}
