"""The export pipeline in one process: the real API, relay, worker and janitor code on the real
Postgres, RabbitMQ and a moto server, driven over HTTP.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from services.janitor.main import serve as serve_janitor
from services.relay.main import serve as serve_relay
from services.worker.main import serve as serve_worker
from shared.settings import Settings
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

Headers = Callable[..., dict[str, str]]


@pytest.fixture
async def pipeline(settings: Settings, s3: Any) -> AsyncIterator[None]:
    """Relay, worker and janitor running as tasks until the test ends."""
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(serve(settings, stop=stop), name=serve.__module__)
        for serve in (serve_relay, serve_worker, serve_janitor)
    ]
    yield
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)


async def make_conversation(api: TestClient[Any, Any], auth: Headers, cid: str, members: list[str]) -> None:
    response = await api.put(f"/admin/conversations/{cid}", json={"members": members}, headers=auth("root", admin=True))
    assert response.status in (200, 204), await response.text()


async def import_lines(api: TestClient[Any, Any], auth: Headers, cid: str, lines: list[dict[str, Any]]) -> None:
    body = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()
    response = await api.post(
        f"/admin/conversations/{cid}/messages:import",
        data=body,
        headers={**auth("root", admin=True), "Content-Type": "application/x-ndjson"},
    )
    assert response.status == 200, await response.text()


async def read_all(api: TestClient[Any, Any], auth: Headers, user: str, cid: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        response = await api.get(
            f"/v2/conversations/{cid}/messages", params={"after_seq": after, "limit": 1000}, headers=auth(user)
        )
        assert response.status == 200
        page = await response.json()
        messages += page["messages"]
        after = page["next_after_seq"]
    return messages


async def submit(
    api: TestClient[Any, Any], auth: Headers, user: str, cid: str, body: dict[str, Any], key: str
) -> Any:
    return await api.post(
        f"/v3/conversations/{cid}/exports", json=body, headers={**auth(user), "Idempotency-Key": key}
    )


async def wait_terminal(api: TestClient[Any, Any], auth: Headers, user: str, location: str) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        response = await api.get(location, headers=auth(user))
        body: dict[str, Any] = await response.json()
        return body if "next_poll_after_seconds" not in body else None

    result: dict[str, Any] = await wait_for(ended, timeout=30)
    return result


def expected_file(messages: list[dict[str, Any]]) -> bytes:
    return b"".join(
        json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n" for message in messages
    )


async def test_export_matches_the_read_api_byte_for_byte(
    api: TestClient[Any, Any], auth: Headers, pipeline: None
) -> None:
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    bodies = ["你好", 'say "hi"\n\\', "\u2028\x01\x7f", "emoji 😀", "plain"]
    lines = [{"message_id": f"m-{i}", "sender_id": ["alice", "bob"][i % 2], "body": b} for i, b in enumerate(bodies)]
    await import_lines(api, auth, "c-a", lines)

    response = await submit(api, auth, "alice", "c-a", {"format": "jsonl"}, "key-1")
    assert response.status == 202
    assert response.headers["Cache-Control"] == "no-store"
    location = response.headers["Location"]

    operation = await wait_terminal(api, auth, "alice", location)
    assert operation["state"] == "SUCCEEDED", operation
    download = await api.get(operation["result"]["url"], headers=auth("alice"))
    assert download.status == 200
    content = await download.read()

    expected = expected_file(await read_all(api, auth, "alice", "c-a"))
    assert content == expected
    assert operation["result"]["sha256"] == hashlib.sha256(expected).hexdigest()
    assert operation["result"]["message_count"] == len(bodies)
    assert operation["result"]["size_bytes"] == len(expected)
    assert operation["snapshot"] == {"max_seq": len(bodies)}


async def test_range_boundaries_and_empty_range(api: TestClient[Any, Any], auth: Headers, pipeline: None) -> None:
    await make_conversation(api, auth, "c-r", ["alice"])
    await import_lines(api, auth, "c-r", [{"message_id": f"m-{i}", "sender_id": "alice", "body": str(i)} for i in range(1, 11)])
    all_messages = await read_all(api, auth, "alice", "c-r")

    cases = [({"after_seq": 3, "before_seq": 8}, [4, 5, 6, 7]), ({"after_seq": 9}, [10]), ({"after_seq": 10}, [])]
    for number, (bounds, seqs) in enumerate(cases):
        response = await submit(api, auth, "alice", "c-r", {"format": "jsonl", **bounds}, f"range-{number}")
        assert response.status == 202
        operation = await wait_terminal(api, auth, "alice", response.headers["Location"])
        assert operation["state"] == "SUCCEEDED"
        content = await (await api.get(operation["result"]["url"], headers=auth("alice"))).read()
        assert content == expected_file([m for m in all_messages if m["seq"] in seqs])
        assert operation["result"]["message_count"] == len(seqs)
