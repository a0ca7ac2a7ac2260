"""``shared/schema.sql`` is exactly what the migrations build (docs/development.md: Development, Today's schema)."""

from __future__ import annotations

import difflib

import pytest

from devtools.schema import SNAPSHOT, dump_schema

pytestmark = pytest.mark.integration  # the real Postgres, reached without the database fixtures


def test_the_snapshot_is_what_the_migrations_build(database_url: str) -> None:
    built = dump_schema(database_url)
    snapshot = SNAPSHOT.read_text()
    difference = "".join(
        difflib.unified_diff(snapshot.splitlines(True), built.splitlines(True), "shared/schema.sql", "migrated")
    )
    assert built == snapshot, f"run `python -m devtools.schema` to write the snapshot anew:\n{difference}"
