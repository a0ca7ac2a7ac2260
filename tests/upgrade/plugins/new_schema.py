"""Loaded into the previous release's own test run (``-p new_schema``): its migrator applies this release's pre
migrations instead of its own, so that its database tests run on the schema an upgrade gives it before the
post migrations (docs/deploy.md: Upgrading, The live upgrade test). Nothing else of the previous release
changes.

It imports nothing of this release: it runs in the previous release's virtualenv, where ``shared`` is that
release's package. ``CHATEXPORT_UPGRADE_MIGRATIONS`` names this release's migrations folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

FOLDER_ENV = "CHATEXPORT_UPGRADE_MIGRATIONS"
# The step mark as this release's migrator reads it (shared/migrator.py), in the leading comment lines.
POST_STEP = re.compile(r"^--\s*step:\s*post\s*$")


def pytest_configure(config: pytest.Config) -> None:
    """Put this release's pre migrations in the place of the previous release's ``shared.db.migration_files``."""
    import shared.db

    folder = Path(os.environ[FOLDER_ENV])

    def migration_files() -> list[tuple[str, str]]:
        found = [(path.stem, path.read_text(encoding="utf-8")) for path in sorted(folder.glob("[0-9]*.sql"))]
        return [(version, sql) for version, sql in found if not _is_post(sql)]

    shared.db.migration_files = migration_files  # type: ignore[attr-defined]


def _is_post(sql: str) -> bool:
    for line in sql.splitlines():
        if not line.startswith("--"):
            return False
        if POST_STEP.match(line):
            return True
    return False
