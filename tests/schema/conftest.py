"""Fixtures of the schema tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from shared.db import ensure_database
from tests.support import PG_SERVER


@pytest.fixture
async def empty_database_url() -> AsyncIterator[str]:
    """The URL of a new, empty database (nothing migrated); dropped after the test."""
    name = f"chatexport_steps_{uuid.uuid4().hex[:10]}"
    url = f"{PG_SERVER}/{name}"
    await ensure_database(url)
    yield url
    conn = await asyncpg.connect(f"{PG_SERVER}/postgres")
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()
