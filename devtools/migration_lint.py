"""The migration linter `make lint` runs (docs/development.md: Migrations): Squawk on every migration after
``shared.migrator.LAST_UNMARKED``, and the rules of the steps that Squawk cannot know.

Squawk (``squawk-cli``) checks each file for what locks or rewrites a busy table; a migration that runs in a
transaction is checked as one (``--assume-in-transaction``). Rules turned off for the whole project, each
with its reason, are ``EXCLUDED_RULES``; a post migration may also drop (``POST_ALLOWED``). The step rules:
a pre migration only adds (``PRE_FORBIDDEN``), and ``CREATE INDEX CONCURRENTLY`` needs
``-- transaction: none``.

``python -m devtools.migration_lint [FILE...]`` lints the files given (default: every migration after
``LAST_UNMARKED``), prints each finding and exits 1 when there is one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from shared.migrator import LAST_UNMARKED, BadMigration, Migration, Step, parse

MIGRATIONS = Path(__file__).resolve().parent.parent / "shared" / "migrations"
PG_VERSION = "15"  # the server the project runs on (docs/deploy.md: Deployment and scaling)
EXCLUDED_RULES = {
    # shared.migrator sets lock_timeout for every migration it runs: the files need not.
    "require-lock-timeout": "the migrator sets lock_timeout before every migration",
    # A statement timeout would cut off an index built CONCURRENTLY on a large table and leave it invalid;
    # what a migration may wait for is bounded by lock_timeout instead.
    "require-statement-timeout": "an index built CONCURRENTLY may take long; lock_timeout bounds the waits",
    # The project's integers that are not ids (versions, counts, sizes in pages) never come near 2^31.
    "prefer-bigint-over-int": "the ids are bigint or text already; other integers are small counts",
    "prefer-bigint-over-smallint": "as prefer-bigint-over-int",
}
# Squawk rules a post migration may break: removing is what the post step is for, once no reader is left.
POST_ALLOWED = {
    "ban-drop-column": "a post migration runs once no part of the previous release reads the column",
    "ban-drop-table": "as ban-drop-column",
}
# What a pre migration may not do: it runs while the previous release still reads and writes everything.
PRE_FORBIDDEN = {
    r"\bDROP\s+(TABLE|COLUMN|FUNCTION|INDEX|VIEW|TYPE|TRIGGER|CONSTRAINT)\b": "drops what the running release uses",
    r"\bVALIDATE\s+CONSTRAINT\b": "validates a constraint (a post step, after the old writers are gone)",
    r"\bSET\s+NOT\s+NULL\b": "tightens a column (a post step)",
    r"\bRENAME\b": "renames what the running release uses",
    r"\bALTER\s+COLUMN\s+\w+\s+(SET\s+DATA\s+)?TYPE\b": "changes a column's type",
}


def squawk() -> str:
    """The ``squawk`` program installed beside this interpreter (``squawk-cli``). Raises ``RuntimeError``."""
    beside = Path(sys.executable).parent / "squawk"
    found = str(beside) if beside.exists() else shutil.which("squawk")
    if found is None:
        raise RuntimeError("squawk is not installed: `make install` installs squawk-cli")
    return found


def lint(path: Path) -> list[str]:
    """The findings for the migration file ``path`` (``version: what``), empty when it passes."""
    version = path.name.removesuffix(".sql")
    try:
        migration = parse(version, path.read_text("utf-8"))
    except BadMigration as exc:
        return [str(exc)]
    return _step_findings(migration) + _squawk_findings(path, migration)


def _step_findings(migration: Migration) -> list[str]:
    code = _without_comments(migration.sql)
    findings = []
    if migration.step is Step.PRE:
        for pattern, why in PRE_FORBIDDEN.items():
            if re.search(pattern, code, re.IGNORECASE):
                findings.append(f"{migration.version}: a pre migration {why}; make it a post migration")
    if re.search(r"\bCONCURRENTLY\b", code, re.IGNORECASE) and migration.transactional:
        findings.append(f"{migration.version}: CONCURRENTLY cannot run in a transaction: add `-- transaction: none`")
    return findings


def _squawk_findings(path: Path, migration: Migration) -> list[str]:
    excluded = [*EXCLUDED_RULES, *(POST_ALLOWED if migration.step is Step.POST else ())]
    command = [squawk(), "--reporter", "gcc", "--pg-version", PG_VERSION, "--exclude", ",".join(excluded)]
    command.append("--assume-in-transaction" if migration.transactional else "--no-assume-in-transaction")
    result = subprocess.run([*command, str(path)], capture_output=True, text=True, check=False)
    if result.returncode == 0:
        return []
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return [f"{migration.version}: squawk: {line}" for line in lines] or [f"{migration.version}: {result.stderr}"]


def _without_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def linted_migrations() -> list[Path]:
    """The migrations the linter checks: every one after ``LAST_UNMARKED``, in order."""
    return sorted(path for path in MIGRATIONS.glob("*.sql") if path.name[:4] > LAST_UNMARKED)


def main(argv: Sequence[str]) -> int:
    """Lint ``argv`` (paths) or every linted migration; print the findings; 1 when there are any."""
    paths = [Path(arg) for arg in argv] or linted_migrations()
    findings = [finding for path in paths for finding in lint(path)]
    for finding in findings:
        print(finding)
    print(f"migrations linted: {len(paths)}, findings: {len(findings)}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
