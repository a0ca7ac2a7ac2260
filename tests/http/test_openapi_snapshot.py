"""The API's contract (docs/development.md: The API's contract): the committed snapshot ``docs/openapi.json``
is the document the code builds, and every problem code a view raises by name is one its routes declare.
"""

from __future__ import annotations

import ast
import inspect
from types import ModuleType

import pytest

from devtools import openapi_snapshot
from services.api.http.contract import ANY_ROUTE_PROBLEMS
from services.api.http.problems import CODES
from services.api.views import exports, messages, operations, schedules, webhooks

VIEWS = (exports, messages, operations, schedules, webhooks)
# Helpers of services.api.http.problems that build one problem each.
NAMED_PROBLEMS = {"not_found": "NOT_FOUND", "validation_failed": "VALIDATION_FAILED"}


def test_the_snapshot_is_the_document_the_code_builds() -> None:
    built = openapi_snapshot.render(openapi_snapshot.document())
    assert openapi_snapshot.SNAPSHOT.read_text(encoding="utf-8") == built, (
        "the API's document changed: if that was meant, run `.venv/bin/python -m devtools.openapi_snapshot` and"
        " commit docs/openapi.json with the change"
    )


def raised_codes(module: ModuleType) -> set[str]:
    """The problem codes ``module`` names where it builds a problem: ``ProblemError("CODE", ...)`` and the
    named helpers."""
    codes: set[str] = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        if name == "ProblemError" and node.args and isinstance(node.args[0], ast.Constant):
            codes.add(str(node.args[0].value))
        elif name in NAMED_PROBLEMS:
            codes.add(NAMED_PROBLEMS[name])
    return codes


@pytest.mark.parametrize("module", VIEWS, ids=lambda module: module.__name__.rsplit(".", 1)[1])
def test_every_problem_a_view_names_is_declared_by_its_routes(module: ModuleType) -> None:
    declared = {code for endpoint in module.ENDPOINTS for code in endpoint.problems} | set(ANY_ROUTE_PROBLEMS)
    raised = raised_codes(module)
    assert raised <= set(CODES), raised - set(CODES)
    assert raised <= declared, f"raised but declared by no route of {module.__name__}: {sorted(raised - declared)}"


def test_the_reading_finds_the_problems_the_views_raise() -> None:
    # Without this, a reading that found nothing would pass every module above.
    assert {"NOT_FOUND", "RESULT_NOT_READY", "DUPLICATE_MESSAGE_ID", "ALREADY_TERMINAL"} <= set().union(
        *map(raised_codes, VIEWS)
    )
