"""The enumerations the database constrains are those of the code: a migrated database's CHECK constraints
list exactly the formats and compressions of ``shared.formats`` (README: API reference, Export options).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import asyncpg
import pytest

from shared.formats import COMPRESSIONS, FORMAT_NAMES

pytestmark = pytest.mark.integration

_CHECK_OF_COLUMN = """
SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
WHERE c.contype = 'c' AND c.conrelid = $1::regclass AND a.attname = $2
"""


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    yield connection
    await connection.close()


async def allowed_values(conn: asyncpg.Connection, table: str, column: str) -> set[str]:
    """The text values the one CHECK constraint on ``table.column`` admits."""
    definitions = [row[0] for row in await conn.fetch(_CHECK_OF_COLUMN, table, column)]
    assert len(definitions) == 1, definitions
    return set(re.findall(r"'([^']*)'::text", definitions[0]))


@pytest.mark.parametrize(("column", "values"), [("format", FORMAT_NAMES), ("compression", COMPRESSIONS)])
async def test_the_operation_request_columns_admit_exactly_the_registry(
    conn: asyncpg.Connection, column: str, values: tuple[str, ...]
) -> None:
    assert await allowed_values(conn, "operations", column) == set(values)
