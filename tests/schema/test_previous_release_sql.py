"""The SQL of the release now running, read from its commit, still prepares on this release's schema, so a
migration that breaks the previous release fails here (docs/deploy.md: Upgrading).

The previous release is the newest one in CHANGELOG.md, found by its ``Commit:`` line. Its statements are the
string literals of its Python files under ``shared/`` and ``services/`` that begin with a statement keyword;
each is prepared (parsed, its names and types resolved) on a freshly migrated database, and not run.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import asyncpg
import pytest

from devtools.releases import previous_release

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STATEMENT = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH) ")  # the project writes keywords in capitals
COMMAND_TAG = re.compile(r"(INSERT|UPDATE|DELETE|SELECT)( \d+)+")  # a status such as "INSERT 0 1", not SQL
# Fewer than this would mean the reading below lost the statements, not that the release had none.
FEWEST_STATEMENTS = 90  # 0.1.0 has 95


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


def statements_of(commit: str) -> dict[str, str]:
    """``{"path:line": sql}`` for every statement literal of the release's Python files."""
    try:
        paths = git("ls-tree", "-r", "--name-only", commit, "--", "shared", "services").split()
    except subprocess.CalledProcessError as exc:
        raise AssertionError(f"commit {commit} is not in this clone (a shallow clone?): {exc.stderr}") from exc
    found: dict[str, str] = {}
    for path in paths:
        if not path.endswith(".py"):
            continue
        tree = ast.parse(git("show", f"{commit}:{path}"))
        # An f-string's pieces, or a template with {} filled in at run time, are not statements yet.
        pieces = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in pieces:
                continue
            # A statement ending in "," is completed by its caller (a claim's RETURNING list).
            fragment = "{" in node.value or node.value.rstrip().endswith(",")
            if STATEMENT.match(node.value) and not COMMAND_TAG.fullmatch(node.value) and not fragment:
                found[f"{path}:{node.lineno}"] = node.value
    return found


async def test_every_statement_of_the_previous_release_prepares_on_this_schema(database_url: str) -> None:
    statements = statements_of(previous_release()[1])
    assert len(statements) >= FEWEST_STATEMENTS, len(statements)
    conn = await asyncpg.connect(database_url)
    refused = {}
    try:
        for where, sql in statements.items():
            try:
                await conn.prepare(sql)
            except asyncpg.PostgresError as exc:
                refused[where] = f"{type(exc).__name__}: {exc}"
    finally:
        await conn.close()
    assert refused == {}
