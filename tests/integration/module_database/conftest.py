"""One database per test module, emptied before each test.

Elsewhere every test gets a fresh clone of the migrated template (``database_url`` in ``tests/conftest.py``),
which costs a second or more on a busy server. The modules in this folder hold many short tests of the API
that need no more than empty tables, so for them pytest finds the ``database_url`` below first: one clone
per module (``module_database``), emptied before each test. A test that must have a database of its own
belongs outside this folder; a module moved in here must leave no state behind but rows (its tests run one
after another, and each stops its pipeline before it ends).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from graphlib import TopologicalSorter

import asyncpg
import pytest

from tests.support import cloned_database

_TABLES_SQL = "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'schema_migrations'"
_FOREIGN_KEYS_SQL = """
SELECT conrelid::regclass::text AS child, confrelid::regclass::text AS parent
FROM pg_constraint WHERE contype = 'f' AND connamespace = 'public'::regnamespace
"""


@pytest.fixture(scope="module")
async def module_database(template_db: str) -> AsyncIterator[str]:
    """One clone of the migrated template per test module."""
    async with cloned_database(template_db, "chatexport_m") as url:
        yield url


@pytest.fixture
async def database_url(module_database: str) -> str:
    """Replaces the per-test clone of ``tests/conftest.py`` in this folder: the module's database, emptied
    before each test, so every test starts from the rows a fresh clone has (ids of sequences go on counting;
    no test depends on their values).
    """
    conn = await asyncpg.connect(module_database)
    try:
        await conn.execute(await _delete_everything_sql(conn))
    finally:
        await conn.close()
    return module_database


async def _delete_everything_sql(conn: asyncpg.Connection) -> str:
    # DELETE, children before parents: much cheaper than TRUNCATE for a few rows on a busy server.
    graph: dict[str, set[str]] = {row["tablename"]: set() for row in await conn.fetch(_TABLES_SQL)}
    for row in await conn.fetch(_FOREIGN_KEYS_SQL):
        if row["child"] != row["parent"]:
            graph[row["parent"]].add(row["child"])
    order = TopologicalSorter(graph).static_order()
    return "; ".join(f'DELETE FROM "{table}"' for table in order)
