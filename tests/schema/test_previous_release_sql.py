"""The SQL of the release now running, read from its commit, still prepares on this release's schema and reads
the same shape of result, so a migration that breaks the previous release fails here (docs/deploy.md:
Upgrading).

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
from shared import migrator
from shared.migrator import Step

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STATEMENT = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH) ")  # the project writes keywords in capitals
COMMAND_TAG = re.compile(r"(INSERT|UPDATE|DELETE|SELECT)( \d+)+")  # a status such as "INSERT 0 1", not SQL
# Fewer than this would mean the reading below lost the statements, not that the release had none.
FEWEST_STATEMENTS = 90  # 0.1.0 has 95
# Statements of the previous release whose result this release's pre migrations widen, each with why the
# previous release still runs it. Postgres refuses a prepared statement whose result changed shape, and asyncpg
# prepares it again and retries once, outside a transaction only (docs/deploy.md: What each mix of releases
# may do).
WIDENED = {
    # claim_export returns an operations row, which this release's columns widen; 0.1.0's worker calls it
    # outside a transaction, so only a retry that two migrations' commits straddle fails, and the janitor
    # wakes the export again.
    "SELECT parked, took_over, member, (claimed).* FROM claim_export($1, $2, $3, $4, $5)": "0.1.0",
}


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


async def result_shapes(database_url: str, statements: dict[str, str]) -> dict[str, list[tuple[str, int]]]:
    """``{"path:line": [(column, type oid), ...]}``: the result each statement returns, prepared on
    ``database_url``.
    """
    conn = await asyncpg.connect(database_url)
    try:
        return {
            where: [(a.name, a.type.oid) for a in (await conn.prepare(sql)).get_attributes()]
            for where, sql in statements.items()
        }
    finally:
        await conn.close()


async def test_this_release_pre_migrations_leave_the_previous_release_results_as_they_were(
    empty_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    version, commit = previous_release()
    statements = statements_of(commit)
    shipped = {
        path.rpartition("/")[2].removesuffix(".sql")
        for path in git("ls-tree", "-r", "--name-only", commit, "--", "shared/migrations").split()
    }
    previous = tuple(m for m in migrator.migrations() if m.version in shipped)
    with monkeypatch.context() as patched:
        patched.setattr(migrator, "migrations", lambda: previous)
        assert await migrator.migrate(empty_database_url), f"no migration of {version} applied"
    before = await result_shapes(empty_database_url, statements)
    assert await migrator.migrate(empty_database_url, steps=[Step.PRE]), "this release has no pre migration"
    after = await result_shapes(empty_database_url, statements)
    changed = {statements[where] for where in statements if before[where] != after[where]}
    assert changed == {sql for sql, release in WIDENED.items() if release == version}
