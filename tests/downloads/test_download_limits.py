"""Downloads that hold a connection long (docs/api.md: Downloads, Download slots): one user's cap leaves
others their slots, a transfer below the minimum rate is cut and gives its slot back, and a frozen S3 gets
the documented 503 within the S3 timeout rather than a minute later.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from services.api.app import init_app
from shared.settings import Settings
from tests.support import wait_for
from tests.support.api_calls import expect_problem, import_lines, make_conversation, submit, wait_terminal
from tests.support.exports import Auth, Client, download_events, held_download

pytestmark = pytest.mark.module_database

BIG_BODY = "x" * 60_000


async def _export(api: Client, auth: Auth, user: str, cid: str, messages: int, body: str) -> dict[str, Any]:
    await make_conversation(api, auth, cid, [user])
    lines = [{"message_id": f"m{n}", "sender_id": user, "body": body} for n in range(messages)]
    await import_lines(api, auth, cid, lines)
    response = await submit(api, auth, user, cid, {"format": "jsonl"}, f"k-{cid}")
    operation = await wait_terminal(api, auth, user, response.headers["Location"])
    assert operation["state"] == "SUCCEEDED", operation
    return operation


@contextlib.asynccontextmanager
async def _api(settings: Settings, **overrides: Any) -> AsyncIterator[Client]:
    """A second API process-alike on the test's database with ``overrides`` to its settings."""
    async with TestClient(TestServer(init_app(settings.model_copy(update=overrides)))) as client:
        yield client


async def test_one_user_cannot_take_every_download_slot(
    api: Client, auth: Auth, settings: Settings, pool: asyncpg.Pool, pipeline: None
) -> None:
    big = await _export(api, auth, "alice", "c-big", 300, BIG_BODY)
    assert big["result"]["size_bytes"] > 16_000_000  # far more than socket buffers hold
    small = await _export(api, auth, "bob", "c-small", 3, "hi")
    alice = auth("alice")["Authorization"]
    async with _api(settings, download_concurrency=3, download_per_user_concurrency=2) as capped:
        url = big["result"]["url"]
        async with held_download(capped, url, alice), held_download(capped, url, alice):
            third = await capped.get(url, headers=auth("alice"))
            await expect_problem(third, 429, "TOO_MANY_DOWNLOADS")
            assert third.headers["Retry-After"] == "5"
            others = await capped.get(small["result"]["url"], headers=auth("bob"))
            assert others.status == 200
            assert len(await others.read()) == small["result"]["size_bytes"]

        async def served() -> bool:
            again = await capped.get(url, headers={**auth("alice"), "Range": "bytes=0-9"})
            return again.status == 206

        assert await wait_for(served, timeout=30)
    assert ("alice", "TOO_MANY_DOWNLOADS") in await download_events(pool, big["operation_id"])


async def test_a_download_below_the_minimum_rate_is_cut_and_frees_its_slot(
    api: Client, auth: Auth, settings: Settings, pipeline: None
) -> None:
    big = await _export(api, auth, "alice", "c-big", 300, BIG_BODY)
    size = big["result"]["size_bytes"]
    limits = {
        "download_min_bytes_per_second": 1_000_000,
        "download_rate_window_seconds": 1.0,
        "download_write_timeout_seconds": 600.0,
        "download_per_user_concurrency": 1,
    }
    async with _api(settings, **limits) as strict:
        url = big["result"]["url"]
        received = 0
        async with held_download(strict, url, auth("alice")["Authorization"]) as reader:

            async def cut() -> bool:
                nonlocal received
                # About 40 KB/s: a reader far below the minimum, but reading.
                chunk = await reader.read(2048)
                received += len(chunk)
                return chunk == b""

            with contextlib.suppress(ConnectionResetError):
                await wait_for(cut, timeout=60, interval=0.05)
        assert received < size

        async def served() -> bool:
            again = await strict.get(url, headers={**auth("alice"), "Range": "bytes=0-9"})
            return again.status == 206

        assert await wait_for(served, timeout=30)


async def test_a_frozen_s3_answers_503_within_the_s3_timeout(
    api: Client, auth: Auth, settings: Settings, pipeline: None
) -> None:
    operation = await _export(api, auth, "alice", "c-frozen", 3, "hi")
    connections: list[asyncio.StreamWriter] = []

    async def never_answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)

    frozen = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = frozen.sockets[0].getsockname()[1]
    try:
        frozen_s3 = {"s3_endpoint_url": f"http://127.0.0.1:{port}", "s3_timeout_seconds": 3.0}
        async with _api(settings, **frozen_s3) as cut_off:
            # Each of botocore's two tries would wait 3 s on its own: the answer must come before a second.
            response = await asyncio.wait_for(cut_off.get(operation["result"]["url"], headers=auth("alice")), 5.5)
            problem = await expect_problem(response, 503, "SERVICE_UNAVAILABLE")
            assert response.headers["Retry-After"] == "30"
            assert "storage" in problem["detail"]
        assert connections, "the API never reached the frozen S3"
    finally:
        for writer in connections:
            writer.close()
        frozen.close()
        await frozen.wait_closed()
