"""How the API's request middleware answers failures that are not problems (docs/api.md: Error codes): a connection
reset that comes from the database while the client still waits is the database restarting, answered 503,
never taken for the client going away; a failure after an answer began (a download, an event stream) closes
the connection after what was sent, never appending a second answer that a client would read as the file.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.api.http.middlewares import request_middleware


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async def reset_by_the_database(request: web.Request) -> web.Response:
        raise ConnectionResetError("Connection reset by peer")  # as a dropped database connection raises it

    app = web.Application(middlewares=[request_middleware])
    app.router.add_get("/reset", reset_by_the_database)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def test_a_reset_while_the_client_waits_is_a_503(client: TestClient[web.Request, web.Application]) -> None:
    response = await client.get("/reset")

    assert response.status == 503
    assert (await response.json())["code"] == "SERVICE_UNAVAILABLE"
    assert response.headers["Retry-After"] == "5"


PARTIAL = b"x" * 10


async def begun_then(request: web.Request) -> web.StreamResponse:
    """Begins a 1,000-byte answer, sends 10 bytes of it, then fails as the query string says."""
    response = web.StreamResponse()
    response.content_length = 1000
    await response.prepare(request)
    await response.write(PARTIAL)
    if request.query["error"] == "database":
        raise asyncpg.InternalClientError("cannot switch to state 15; another operation (2) is in progress")
    raise RuntimeError("a failure of ours")


async def raw_exchange(port: int, path: str) -> bytes:
    """Everything the server sends on one connection for one GET, until it closes (at most 5 s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    try:
        async with asyncio.timeout(5):
            return await reader.read()  # to the end: the server closed the connection
    finally:
        writer.close()


@pytest.mark.parametrize("error", ["database", "ours"])
async def test_a_failure_after_the_answer_began_closes_the_connection_without_a_second_answer(error: str) -> None:
    app = web.Application(middlewares=[request_middleware])
    app.router.add_get("/begun", begun_then)
    async with TestServer(app) as server:
        assert server.port is not None
        received = await raw_exchange(server.port, f"/begun?error={error}")

    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"Content-Length: 1000" in head
    assert body == PARTIAL  # what was written, then the close: no status line of another answer
