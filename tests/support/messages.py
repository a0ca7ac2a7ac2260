"""Helpers of the message store tests (docs/api.md: Message store): sends, reads and imports as the
API takes them, the rows they leave, and another instance of the app with some settings changed.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from aiohttp.test_utils import TestClient, TestServer

from devtools.moto import MotoServer
from services.api.app import init_app
from services.api.exporting.changes import OperationChanges
from shared.settings import Settings
from tests.support import make_settings, wait_for

Client = TestClient[Any, Any]
Auth = Callable[..., dict[str, str]]

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


async def send(api: Client, auth: Auth, user: str, cid: str, message_id: str, body: str) -> Any:
    return await api.post(
        f"/v2/conversations/{cid}/messages", json={"message_id": message_id, "body": body}, headers=auth(user)
    )


async def upload(api: Client, auth: Auth, user: str, cid: str, name: str, data: Any, content_type: str) -> Any:
    """``user``'s upload of ``data`` (bytes, or an async iterator of them) as ``name``; the response."""
    return await api.post(
        f"/v2/conversations/{cid}/attachments",
        params={"name": name},
        data=data,
        headers={**auth(user), "Content-Type": content_type},
    )


async def uploaded(api: Client, auth: Auth, user: str, cid: str, name: str, data: bytes, content_type: str) -> Any:
    answer = await upload(api, auth, user, cid, name, data, content_type)
    assert answer.status == 201, await answer.text()
    return await answer.json()


async def send_with(api: Client, auth: Auth, user: str, cid: str, message_id: str, ids: list[str]) -> Any:
    return await api.post(
        f"/v2/conversations/{cid}/messages",
        json={"message_id": message_id, "body": "see", "attachments": ids},
        headers=auth(user),
    )


async def send_raw(api: Client, auth: Auth, user: str, cid: str, data: bytes, content_type: str) -> Any:
    headers = {**auth(user), "Content-Type": content_type}
    return await api.post(f"/v2/conversations/{cid}/messages", data=data, headers=headers)


async def read(api: Client, auth: Auth, user: str, cid: str, **query: Any) -> Any:
    return await api.get(f"/v2/conversations/{cid}/messages", params=query, headers=auth(user))


def ndjson(lines: list[Any]) -> bytes:
    """One line per item: a dict is dumped as JSON, a str is sent as its text, bytes as they are."""
    return b"".join(_encoded(line) + b"\n" for line in lines)


def _encoded(line: Any) -> bytes:
    if isinstance(line, bytes):
        return line
    return (line if isinstance(line, str) else json.dumps(line)).encode()


async def post_import(api: Client, auth: Auth, cid: str, lines: list[Any], *, content_type: str | None = None) -> Any:
    headers = {**auth("admin", admin=True), "Content-Type": content_type or "application/x-ndjson"}
    return await api.post(f"/admin/conversations/{cid}/messages:import", data=ndjson(lines), headers=headers)


async def stored(pool: asyncpg.Pool, cid: str) -> tuple[int, int | None]:
    """(number of message rows, conversations.last_seq) of ``cid``; last_seq is None without the row."""
    count = await pool.fetchval("SELECT count(*) FROM messages WHERE conversation_id = $1", cid)
    last_seq = await pool.fetchval("SELECT last_seq FROM conversations WHERE conversation_id = $1", cid)
    return count, last_seq


@asynccontextmanager
async def configured_api(settings: Settings, moto: MotoServer, **overrides: Any) -> AsyncIterator[Client]:
    """Another instance of the app on this test's database, with some settings changed."""
    client: Client = TestClient(
        TestServer(init_app(make_settings(settings.database_url, moto.endpoint_url, **overrides)))
    )
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def listen_now(changes: OperationChanges) -> None:
    """Have ``changes`` listen now, as a first waiter would, and keep listening for its linger after: a test's
    waiters then miss no change and are woken by none but the test's own.
    """
    with changes.subscribe("op_listen_now"):
        await wait_for(lambda: changes.listening)
