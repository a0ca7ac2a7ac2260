"""Helpers of the exports API tests (docs/api.md: API reference): raw submissions, stored-row counts, the access events
of downloads, a download whose reading the test holds back, and the constants their checks share. Problems are
checked with ``tests.support.api_calls.expect_problem``, rows arranged with ``tests.support.rows``; the fixtures are in
the ``conftest.py`` files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
from aiohttp.test_utils import TestClient

Client = TestClient[Any, Any]
Auth = Callable[..., dict[str, str]]

JSON = "application/json"
NDJSON = "application/x-ndjson"
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
# What a submission stores (docs/architecture.md: How it works): a refused request must leave all three untouched.
STORED_TABLES = ("operations", "idempotency_keys", "outbox")
REPRESENTATION_KEYS = {
    "operation_id",
    "kind",
    "state",
    "conversation_id",
    "request",
    "estimate",
    "created_at",
    "updated_at",
    "attempt",
    "progress",
    "snapshot",
    "retry_at",
    "error",
    "result",
    "links",
    "done",
    "schedule_id",
    "due_at",
}
# An id that was never handed out, with the shape of a real one.
GUESSED_ID = "op_AAAAAAAAAAAAAAAAAAAAAAAA"


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


@contextlib.asynccontextmanager
async def held_download(client: Client, url: str, authorization: str) -> AsyncIterator[asyncio.StreamReader]:
    """A download over a socket with a tiny receive buffer, whose reading the test controls; yields once the
    status line says 200. A file far larger than the socket buffers keeps its download slot taken until the
    test reads it or leaves the block.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (client.host, client.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(f"GET {url} HTTP/1.1\r\nHost: x\r\nAuthorization: {authorization}\r\n\r\n".encode())
        await writer.drain()
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        yield reader
    finally:
        writer.close()
