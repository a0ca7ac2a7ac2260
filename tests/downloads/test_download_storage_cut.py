"""A download whose object stops arriving from S3 half-way (docs/api.md: Downloads, Download): the client gets
what was read, then the connection closes, so that it resumes with Range; the API logs the storage failure,
not an internal error of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.api.http.keys import SETTINGS
from services.api.http.middlewares import request_middleware
from services.api.views.exports import _copy
from shared.settings import Settings

FIRST = b"a" * 1000


class CutBody:
    """An S3 body (``iter_chunks``) whose connection drops after its first chunk, as aiobotocore reports it."""

    async def iter_chunks(self, chunk_size: int) -> AsyncIterator[bytes]:
        yield FIRST
        raise aiohttp.ClientPayloadError("Response payload is not completed: ConnectionResetError(104)")


async def download(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    response.content_length = 5000
    await response.prepare(request)
    if await _copy(request, CutBody(), response):
        await response.write_eof()
    return response


async def test_a_body_cut_by_storage_ends_the_download_after_what_was_read(caplog: Any) -> None:
    app = web.Application(middlewares=[request_middleware])
    app[SETTINGS] = Settings()
    app.router.add_get("/result", download)
    with caplog.at_level(logging.INFO):
        async with (
            TestServer(app) as server,
            aiohttp.ClientSession() as session,
            session.get(server.make_url("/result")) as response,
        ):
            assert response.status == 200
            received = b""
            with pytest.raises(aiohttp.ClientPayloadError):
                async with asyncio.timeout(5):
                    async for chunk in response.content.iter_any():
                        received += chunk

    assert received == FIRST
    messages = [record.getMessage() for record in caplog.records]
    assert "result unreadable mid-transfer" in messages
    assert "unhandled error" not in messages
