"""How the API's error middleware answers failures that are not problems (README: Error codes): a connection
reset that comes from the database while the client still waits is the database restarting, answered 503,
never taken for the client going away.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.api.middlewares import error_middleware


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async def reset_by_the_database(request: web.Request) -> web.Response:
        raise ConnectionResetError("Connection reset by peer")  # as a dropped database connection raises it

    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/reset", reset_by_the_database)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def test_a_reset_while_the_client_waits_is_a_503(client: TestClient[web.Request, web.Application]) -> None:
    response = await client.get("/reset")

    assert response.status == 503
    assert (await response.json())["code"] == "SERVICE_UNAVAILABLE"
    assert response.headers["Retry-After"] == "5"
