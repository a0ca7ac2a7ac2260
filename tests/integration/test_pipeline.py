"""The export pipeline in one process: the real API, relay, worker and janitor code on the real
Postgres, RabbitMQ and a moto server, driven over HTTP.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.helpers import (
    Headers,
    expected_file,
    import_lines,
    make_conversation,
    read_all,
    submit,
    wait_terminal,
)

pytestmark = pytest.mark.integration


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
    await import_lines(
        api, auth, "c-r", [{"message_id": f"m-{i}", "sender_id": "alice", "body": str(i)} for i in range(1, 11)]
    )
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
