"""End to end: the real api, relay, two workers, janitor and moto server as processes, driven over HTTP."""

from __future__ import annotations

import hashlib
from typing import Any

import asyncpg
import pytest

from devtools.localsystem import LocalSystem
from tests.support.api_calls import (
    Headers,
    expected_file,
    import_lines,
    make_conversation,
    read_all,
    submit,
    wait_terminal,
)

pytestmark = pytest.mark.e2e


async def download(live_api: Any, live_auth: Headers, user: str, url: str) -> tuple[int, Any, bytes]:
    response = await live_api.get(url, headers=live_auth(user))
    return response.status, response.headers, await response.read()


async def export_and_download(
    live_api: Any, live_auth: Headers, user: str, cid: str, body: dict[str, Any], key: str
) -> bytes:
    response = await submit(live_api, live_auth, user, cid, body, key)
    assert response.status == 202, await response.text()
    operation = await wait_terminal(live_api, live_auth, user, response.headers["Location"], timeout=120)
    assert operation["state"] == "SUCCEEDED", operation
    status, headers, content = await download(live_api, live_auth, user, operation["result"]["url"])
    assert status == 200
    assert hashlib.sha256(content).hexdigest() == operation["result"]["sha256"]
    assert len(content) == operation["result"]["size_bytes"] == int(headers["Content-Length"])
    return content


async def test_corpus_conversation_matches_the_read_api(system: LocalSystem, live_api: Any, live_auth: Headers) -> None:
    system.run_cli("import", "--language", "chinese")
    cid = "corpus-chinese-greetings"
    messages = await read_all(live_api, live_auth, "alice", cid)
    assert len(messages) > 10
    assert any("你好" in message["body"] for message in messages)

    content = await export_and_download(live_api, live_auth, "alice", cid, {"format": "jsonl"}, "corpus-1")
    assert content == expected_file(messages)


async def test_twenty_thousand_messages(live_api: Any, live_auth: Headers) -> None:
    await make_conversation(live_api, live_auth, "e2e-big", ["alice"])
    lines = [{"message_id": f"m{n}", "sender_id": "alice", "body": f"message {n} ünïcode"} for n in range(20_000)]
    await import_lines(live_api, live_auth, "e2e-big", lines)
    messages = await read_all(live_api, live_auth, "alice", "e2e-big")
    assert len(messages) == 20_000

    content = await export_and_download(live_api, live_auth, "alice", "e2e-big", {"format": "jsonl"}, "big-1")
    assert content == expected_file(messages)
    assert [line.count(b'"seq":') for line in content.splitlines()] == [1] * 20_000


async def test_range_boundaries_and_empty_range(live_api: Any, live_auth: Headers) -> None:
    await make_conversation(live_api, live_auth, "e2e-range", ["alice"])
    lines = [{"message_id": f"m{n}", "sender_id": "alice", "body": str(n)} for n in range(1, 21)]
    await import_lines(live_api, live_auth, "e2e-range", lines)
    messages = await read_all(live_api, live_auth, "alice", "e2e-range")
    cases: list[tuple[dict[str, int], list[int]]] = [
        ({"after_seq": 5, "before_seq": 9}, [6, 7, 8]),
        ({"before_seq": 3}, [1, 2]),
        ({"after_seq": 19}, [20]),
        ({"after_seq": 20}, []),
        ({"after_seq": 7, "before_seq": 9}, [8]),
    ]
    for number, (bounds, seqs) in enumerate(cases):
        content = await export_and_download(
            live_api, live_auth, "alice", "e2e-range", {"format": "jsonl", **bounds}, f"r{number}"
        )
        assert content == expected_file([m for m in messages if m["seq"] in seqs]), bounds


async def test_replay_and_reuse_of_an_idempotency_key(live_api: Any, live_auth: Headers) -> None:
    await make_conversation(live_api, live_auth, "e2e-idem", ["uma"])
    first = await submit(live_api, live_auth, "uma", "e2e-idem", {"format": "jsonl", "before_seq": 5}, "idem-1")
    assert first.status == 202
    assert "Idempotent-Replayed" not in first.headers
    again = await submit(
        live_api, live_auth, "uma", "e2e-idem", {"format": "jsonl", "before_seq": 5, "after_seq": 0}, "idem-1"
    )
    assert again.status == 202
    assert again.headers["Location"] == first.headers["Location"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert (await again.json())["operation_id"] == (await first.json())["operation_id"]

    other = await submit(live_api, live_auth, "uma", "e2e-idem", {"format": "jsonl", "before_seq": 6}, "idem-1")
    assert other.status == 409
    assert (await other.json())["code"] == "IDEMPOTENCY_KEY_REUSED"


async def test_non_member_sees_the_same_404_everywhere(live_api: Any, live_auth: Headers) -> None:
    await make_conversation(live_api, live_auth, "e2e-private", ["alice"])
    await import_lines(
        live_api, live_auth, "e2e-private", [{"message_id": "m1", "sender_id": "alice", "body": "secret"}]
    )
    response = await submit(live_api, live_auth, "alice", "e2e-private", {"format": "jsonl"}, "private-1")
    operation = await wait_terminal(live_api, live_auth, "alice", response.headers["Location"], timeout=60)
    assert operation["state"] == "SUCCEEDED"
    guessed = "op_" + "A" * 24

    refusals = [
        await submit(live_api, live_auth, "mallory", "e2e-private", {"format": "jsonl"}, "m-1"),
        await live_api.get(response.headers["Location"], headers=live_auth("mallory")),
        await live_api.get(operation["result"]["url"], headers=live_auth("mallory")),
        await live_api.get(f"/v3/operations/{guessed}", headers=live_auth("mallory")),
        await live_api.get(f"/v3/exports/{guessed}/result", headers=live_auth("mallory")),
        await submit(live_api, live_auth, "mallory", "e2e-no-such-conversation", {"format": "jsonl"}, "m-2"),
    ]
    bodies = []
    for refusal in refusals:
        assert refusal.status == 404
        body = await refusal.json()
        body.pop("instance", None)
        bodies.append(body)
    assert all(body == bodies[0] for body in bodies), bodies
    assert bodies[0]["code"] == "NOT_FOUND"


async def test_access_revoked_after_success_and_no_store(live_api: Any, live_auth: Headers) -> None:
    await make_conversation(live_api, live_auth, "e2e-revoke", ["alice", "bob"])
    await import_lines(live_api, live_auth, "e2e-revoke", [{"message_id": "m1", "sender_id": "bob", "body": "hello"}])
    response = await submit(live_api, live_auth, "alice", "e2e-revoke", {"format": "jsonl"}, "revoke-1")
    assert response.headers["Cache-Control"] == "no-store"
    status_response = await live_api.get(response.headers["Location"], headers=live_auth("alice"))
    assert status_response.headers["Cache-Control"] == "no-store"
    operation = await wait_terminal(live_api, live_auth, "alice", response.headers["Location"], timeout=60)
    status, headers, _ = await download(live_api, live_auth, "alice", operation["result"]["url"])
    assert status == 200
    assert headers["Cache-Control"] == "no-store"

    removed = await live_api.delete(
        "/admin/conversations/e2e-revoke/members/alice", headers=live_auth("root", admin=True)
    )
    assert removed.status == 204
    status, _, body = await download(live_api, live_auth, "alice", operation["result"]["url"])
    assert status == 403
    assert b'"ACCESS_REVOKED"' in body


async def test_operation_and_outbox_row_are_committed_when_202_arrives(
    system: LocalSystem, live_api: Any, live_auth: Headers
) -> None:
    await make_conversation(live_api, live_auth, "e2e-commit", ["dora"])
    conn = await asyncpg.connect(system.env["CHATEXPORT_DATABASE_URL"])
    try:
        for number in range(5):
            response = await submit(live_api, live_auth, "dora", "e2e-commit", {"format": "jsonl"}, f"commit-{number}")
            assert response.status == 202
            operation_id = (await response.json())["operation_id"]
            assert await conn.fetchval("SELECT count(*) FROM operations WHERE operation_id = $1", operation_id) == 1
            assert await conn.fetchval("SELECT count(*) FROM outbox WHERE operation_id = $1", operation_id) >= 1
    finally:
        await conn.close()
