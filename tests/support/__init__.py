"""Helpers every test folder shares, on the real servers: where Postgres and RabbitMQ are, unique names, a
clone of the migrated template database and emptying one, a test's settings, and waiting on a condition with
a deadline. The other modules of this package hold the helpers of one subject each.

Test modules and ``conftest.py`` files import these from here; a ``conftest.py`` holds fixtures only and
is never imported (``tests/project/test_conftest_imports.py`` checks; docs/development.md: Development).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from graphlib import TopologicalSorter
from pathlib import Path
from typing import Any

import asyncpg

from shared.settings import Settings

PG_SERVER = os.environ.get("CHATEXPORT_TEST_PG", "postgresql://postgres@127.0.0.1:5432")
AMQP_URL = os.environ.get("CHATEXPORT_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")


def documented(page: str) -> str:
    """The text of ``docs/<page>`` with each run of whitespace, line breaks included, as one space: a phrase
    the page wraps across lines is found whole.
    """
    return " ".join((Path(__file__).resolve().parents[2] / "docs" / page).read_text().split())


def unique(prefix: str) -> str:
    """A name no other test uses: ``prefix-<12 hex>``."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def admin_execute(sql: str) -> None:
    """Run ``sql`` on the test server's ``postgres`` database (``CREATE``/``DROP DATABASE``)."""
    conn = await asyncpg.connect(f"{PG_SERVER}/postgres")
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def refuse_connections(admin: asyncpg.Connection, database: str) -> None:
    """Make ``database`` refuse new connections and end every session on it, through ``admin`` (a connection to
    another database); returns once none is left. A session whose start passed the check before the refusal
    committed shows in ``pg_stat_activity`` only later, so each look ends what it sees.
    """
    await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')

    async def none_left() -> bool:
        ended: int = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1", database
        )
        return ended == 0

    await wait_for(none_left)


@contextlib.asynccontextmanager
async def cloned_database(template_db: str, prefix: str) -> AsyncIterator[str]:
    """Yield the URL of a new clone of ``template_db`` named ``<prefix>_<hex>``; dropped on exit."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    await admin_execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    try:
        yield f"{PG_SERVER}/{name}"
    finally:
        await admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_TABLES_SQL = "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'schema_migrations'"
_FOREIGN_KEYS_SQL = """
SELECT conrelid::regclass::text AS child, confrelid::regclass::text AS parent
FROM pg_constraint WHERE contype = 'f' AND connamespace = 'public'::regnamespace
"""


async def emptied(database_url: str) -> None:
    """Delete every row of the migrated database at ``database_url`` but its migration records."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(await _delete_everything_sql(conn))
    finally:
        await conn.close()


async def _delete_everything_sql(conn: asyncpg.Connection) -> str:
    # DELETE, children before parents: much cheaper than TRUNCATE for a few rows on a busy server.
    graph: dict[str, set[str]] = {row["tablename"]: set() for row in await conn.fetch(_TABLES_SQL)}
    for row in await conn.fetch(_FOREIGN_KEYS_SQL):
        if row["child"] != row["parent"]:
            graph[row["parent"]].add(row["child"])
    order = TopologicalSorter(graph).static_order()
    return "; ".join(f'DELETE FROM "{table}"' for table in order)


TEST_RATE_LIMITS: dict[str, int] = {
    "rate_limit_submits": 1_000_000,
    "rate_limit_polls": 1_000_000,
    "rate_limit_downloads": 1_000_000,
}
# The same as a part's environment, for the tests that run the parts as processes.
TEST_RATE_LIMIT_ENV: dict[str, str] = {
    f"CHATEXPORT_{name.upper()}": str(value) for name, value in TEST_RATE_LIMITS.items()
}


def make_settings(database_url: str, s3_endpoint_url: str, **overrides: Any) -> Settings:
    """Settings for one test: its own database, bucket, exchange and queue; short timings."""
    values: dict[str, Any] = {
        "environment": "development",
        "database_url": database_url,
        "amqp_url": AMQP_URL,
        "amqp_exchange": unique("chatexport-test"),
        "amqp_queue": unique("chatexport-test"),
        "s3_endpoint_url": s3_endpoint_url,
        "s3_bucket": unique("bucket"),
        "lease_seconds": 5.0,
        "heartbeat_seconds": 1.0,
        "relay_poll_seconds": 0.2,
        "janitor_interval_seconds": 0.5,
        "shutdown_grace_seconds": 5.0,
        "metrics_port": 0,  # a free port each: tests run many parts side by side
        # Tests poll and submit far faster than users: the rate limits' own tests set the policies they test.
        **TEST_RATE_LIMITS,
    }
    values.update(overrides)
    return Settings(**values)


async def wait_for(predicate: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Poll ``predicate`` (sync or async) until it returns a truthy value; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)
