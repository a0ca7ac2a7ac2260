"""Helpers of the exports API tests (contract 5): raw submissions, stored-row counts, problem checks, and a
pipeline that a test starts only once it has arranged the state the worker must find.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from graphlib import TopologicalSorter
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient

from shared.settings import Settings
from tests.conftest import cloned_database

Client = TestClient[Any, Any]
Auth = Callable[..., dict[str, str]]

JSON = "application/json"
PROBLEM_TYPE = "application/problem+json"
NDJSON = "application/x-ndjson"
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
# What a submission stores (contract 5.1): a refused request must leave all three untouched.
STORED_TABLES = ("operations", "idempotency_keys", "outbox")
REPRESENTATION_KEYS = {
    "operation_id",
    "kind",
    "state",
    "conversation_id",
    "request",
    "created_at",
    "updated_at",
    "attempt",
    "progress",
    "snapshot",
    "retry_at",
    "error",
    "result",
    "links",
}
# An id that was never handed out, with the shape of a real one.
GUESSED_ID = "op_AAAAAAAAAAAAAAAAAAAAAAAA"


_TABLES_SQL = "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'schema_migrations'"
_FOREIGN_KEYS_SQL = """
SELECT conrelid::regclass::text AS child, confrelid::regclass::text AS parent
FROM pg_constraint WHERE contype = 'f' AND connamespace = 'public'::regnamespace
"""


@pytest.fixture(scope="module")
async def module_database(template_db: str) -> AsyncIterator[str]:
    """One clone of the migrated template per test module (a clone costs a second or more on a busy server)."""
    async with cloned_database(template_db, "chatexport_m") as url:
        yield url


@pytest.fixture
async def database_url(module_database: str) -> str:
    """Replaces the per-test clone of ``tests/conftest.py`` in the modules that import it: the module's
    database, emptied before each test, so every test starts from the rows a fresh clone has (ids of
    sequences go on counting; no test depends on their values). Tests of a module run one after another,
    and each stops its pipeline before it ends.
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


async def post_export(
    api: Client,
    headers: dict[str, str],
    cid: str,
    body: Any,
    *,
    key: str | None = "key-1",
    content_type: str | None = JSON,
) -> Any:
    """POST a submission exactly as given: ``body`` bytes are sent verbatim, anything else as JSON."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    all_headers = dict(headers)
    if key is not None:
        all_headers["Idempotency-Key"] = key
    if content_type is not None:
        all_headers["Content-Type"] = content_type
    return await api.post(
        f"/v3/conversations/{cid}/exports", data=raw, headers=all_headers, skip_auto_headers=["Content-Type"]
    )


async def stored(pool: asyncpg.Pool) -> dict[str, int]:
    """Row counts of the tables a submission writes."""
    async with pool.acquire() as conn:
        return {table: await conn.fetchval(f"SELECT count(*) FROM {table}") for table in STORED_TABLES}


async def expect_problem(response: Any, status: int, code: str, *, case: object = None) -> dict[str, Any]:
    """Assert an RFC 9457 problem with ``status`` and ``code``; return its body. ``case`` labels failures."""
    text = await response.text()
    assert response.status == status, f"{case}: {response.status} != {status}: {text}"
    content_type = response.headers.get("Content-Type", "")
    assert content_type.startswith(PROBLEM_TYPE), f"{case}: {content_type}"
    body: dict[str, Any] = json.loads(text)
    assert body["code"] == code, (case, body)
    assert body["status"] == status, (case, body)
    assert {"type", "title", "status", "detail", "code"} <= body.keys(), (case, body)
    return body


async def operation_state(pool: asyncpg.Pool, operation_id: str) -> str | None:
    """The state Postgres holds for ``operation_id`` (None when there is no such row)."""
    async with pool.acquire() as conn:
        state: str | None = await conn.fetchval("SELECT state FROM operations WHERE operation_id = $1", operation_id)
        return state


async def download_events(pool: asyncpg.Pool, operation_id: str) -> list[tuple[str, str]]:
    """The (user, outcome) of every download attempt recorded for ``operation_id``, oldest first."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT user_id, outcome FROM access_events WHERE operation_id = $1 AND action = 'download'"
            " ORDER BY access_event_id",
            operation_id,
        )
    return [(row["user_id"], row["outcome"]) for row in rows]


async def objects_under(s3: Any, settings: Settings, operation_id: str) -> list[str]:
    """Keys stored in the test's bucket under the operation's artifact prefix."""
    listing = await s3.list_objects_v2(Bucket=settings.s3_bucket, Prefix=f"{settings.s3_prefix}{operation_id}/")
    return [item["Key"] for item in listing.get("Contents", [])]
