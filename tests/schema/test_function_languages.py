"""The database functions other functions call keep their plans (docs/benchmark.md: Plans kept): a function
written in SQL that Postgres cannot inline into its caller is parsed and planned again at every call, so one
that another function calls is either PL/pgSQL or a scalar expression Postgres inlines. Read from
``shared/schema.sql``, which ``tests/schema/test_schema_snapshot.py`` holds to what the migrations build.
"""

from __future__ import annotations

import re

from devtools.schema import SNAPSHOT

_FUNCTION = re.compile(
    r"^CREATE FUNCTION public\.(?P<name>\w+)\((?P<args>.*?)\) RETURNS (?P<returns>SETOF \w+|TABLE\(.*?\)|\w+)\n"
    r"\s+LANGUAGE (?P<language>\w+)(?P<volatility>[^\n]*)\n\s+AS \$\$\n(?P<body>.*?)\n\$\$;",
    re.MULTILINE | re.DOTALL,
)


def _functions() -> dict[str, re.Match[str]]:
    found = {match["name"]: match for match in _FUNCTION.finditer(SNAPSHOT.read_text())}
    assert len(found) == SNAPSHOT.read_text().count("\nCREATE FUNCTION "), "a function this test does not read"
    return found


def _inlinable(function: re.Match[str]) -> bool:
    """Postgres inlines a SQL function that is one SELECT of an expression, returns a scalar and has no OUT
    parameters (the rules of inline_function in its planner, in part)."""
    body = function["body"].strip()
    return (
        function["returns"] not in ("void", "record", "trigger")
        and " OUT " not in f" {function['args']}"
        and body.upper().startswith("SELECT ")
        and " FROM " not in body.upper()
    )


def test_a_function_other_functions_call_is_plpgsql_or_inlined() -> None:
    functions = _functions()
    replanned = sorted(
        f"{callee} (called by {caller})"
        for callee, function in functions.items()
        if function["language"] == "sql" and not _inlinable(function)
        for caller, other in functions.items()
        if other is not function and re.search(rf"\b{callee}\(", other["body"])
    )
    assert replanned == [], f"planned again at every call: {replanned}"


def test_the_rule_sees_a_function_called_by_another() -> None:
    functions = _functions()
    callers = [caller for caller, function in functions.items() if re.search(r"\bopen_attempt\(", function["body"])]
    assert callers, "no function calls open_attempt: the rule above would check nothing"
    assert functions["operation_is_runnable"]["language"] == "sql" and _inlinable(functions["operation_is_runnable"])
