"""Creating and migrating a database: repeatable, and safe when several processes start at once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from shared.db import ensure_database
from shared.migrator import migrate, migrate_database, migrations
from shared.settings import Settings
from tests.support import PG_SERVER

pytestmark = pytest.mark.integration  # the real Postgres, reached without the database fixtures

REPO = Path(__file__).resolve().parents[2]
ALL_VERSIONS = [migration.version for migration in migrations()]


@pytest.fixture
async def fresh_url() -> AsyncIterator[str]:
    """The URL of a database that does not exist yet; dropped after the test if something created it."""
    name = f"chatexport_m_{uuid.uuid4().hex[:10]}"
    yield f"{PG_SERVER}/{name}"
    conn = await asyncpg.connect(f"{PG_SERVER}/postgres")
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def applied_versions(url: str) -> list[str]:
    conn = await asyncpg.connect(url)
    try:
        return [row["version"] for row in await conn.fetch("SELECT version FROM schema_migrations ORDER BY 1")]
    finally:
        await conn.close()


async def test_migrating_twice_applies_nothing_the_second_time(fresh_url: str) -> None:
    assert await ensure_database(fresh_url) is True
    assert await ensure_database(fresh_url) is False

    assert await migrate(fresh_url) == ALL_VERSIONS
    assert await migrate(fresh_url) == []
    assert await applied_versions(fresh_url) == ALL_VERSIONS


async def test_concurrent_migrations_on_a_fresh_database_both_succeed(fresh_url: str) -> None:
    await ensure_database(fresh_url)

    results = await asyncio.gather(migrate(fresh_url), migrate(fresh_url))

    assert sorted(results, key=len) == [[], ALL_VERSIONS]
    assert await applied_versions(fresh_url) == ALL_VERSIONS


async def test_concurrent_create_and_migrate_both_succeed(fresh_url: str) -> None:
    settings = Settings(database_url=fresh_url)
    results = await asyncio.gather(*(migrate_database(settings) for _ in range(3)))

    # Exactly one call creates the database and exactly one (not necessarily the same) migrates it.
    assert [created for created, _ in results].count(True) == 1
    assert sorted((applied for _, applied in results), key=len) == [[], [], ALL_VERSIONS]
    assert await applied_versions(fresh_url) == ALL_VERSIONS


async def test_the_migrate_command_creates_migrates_and_can_run_concurrently(fresh_url: str) -> None:
    # Two `chatexport migrate` processes at once, as when several containers start together.
    env = {"CHATEXPORT_DATABASE_URL": fresh_url, "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "chatexport.cli", "migrate"]
    processes = [
        await asyncio.create_subprocess_exec(
            *command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    outputs = [await asyncio.wait_for(process.communicate(), 120) for process in processes]

    assert [process.returncode for process in processes] == [0, 0], outputs
    printed = sorted(out.decode() for out, _ in outputs)
    assert any(f"applied: {', '.join(ALL_VERSIONS)}" in text for text in printed), printed
    assert any("applied: nothing" in text for text in printed), printed
    assert await applied_versions(fresh_url) == ALL_VERSIONS
