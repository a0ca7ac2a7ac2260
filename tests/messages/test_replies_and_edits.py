"""Replies and edits (docs/api.md: Message store, Replies and edits): a reply names a message of its conversation,
only the sender edits, reads show the body as it is now, and an export shows each body as of its snapshot, in
every format.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from shared.export.request import ExportRequest
from shared.repository import export_reader, message_store
from tests.support import claims
from tests.support.api_calls import (
    every_format,
    expect_problem,
    expected_file,
    make_conversation,
    read_all,
    submit,
)
from tests.support.exported_files import csv_rows
from tests.support.messages import TIMESTAMP, Auth, Client, send, stored

pytestmark = pytest.mark.module_database


async def reply(api: Client, auth: Auth, user: str, cid: str, message_id: str, body: str, reply_to: str) -> Any:
    return await api.post(
        f"/v2/conversations/{cid}/messages",
        json={"message_id": message_id, "body": body, "reply_to": reply_to},
        headers=auth(user),
    )


async def edit(api: Client, auth: Auth, user: str, cid: str, message_id: str, body: object) -> Any:
    return await api.patch(f"/v2/conversations/{cid}/messages/{message_id}", json={"body": body}, headers=auth(user))


async def test_a_reply_names_its_message_and_reads_show_it(api: Client, auth: Auth, chat: str) -> None:
    await send(api, auth, "u-a", chat, "m-1", "hi")
    answer = await reply(api, auth, "u-b", chat, "m-2", "yes", "m-1")
    assert answer.status == 200, await answer.text()

    messages = await read_all(api, auth, "u-a", chat)
    # A message that replies to none and was never edited shows exactly the fields it always had.
    assert list(messages[0]) == ["conversation_id", "seq", "message_id", "sender_id", "sent_at", "body"]
    assert messages[1]["reply_to"] == "m-1" and "edited_at" not in messages[1]


@pytest.mark.parametrize("target", ["m-none", "m-gone"])
async def test_a_reply_to_no_message_is_refused_and_stores_nothing(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool, target: str
) -> None:
    await send(api, auth, "u-a", chat, "m-gone", "x")
    await api.delete(f"/v2/conversations/{chat}/messages/m-gone", headers=auth("u-a"))
    before = await stored(pool, chat)

    body = await expect_problem(
        await reply(api, auth, "u-b", chat, "m-2", "yes", target), 422, "REPLY_TARGET_NOT_FOUND"
    )

    assert body["errors"][0]["loc"] == ["body", "reply_to"]
    assert await stored(pool, chat) == before  # no row, no seq used up
    retried = await reply(api, auth, "u-b", chat, "m-2", "yes", "m-none")
    assert retried.status == 422  # the message_id was not taken either


async def test_the_sender_edits_and_reads_show_the_new_body(api: Client, auth: Auth, chat: str) -> None:
    await send(api, auth, "u-a", chat, "m-1", "hi")

    answer = await edit(api, auth, "u-a", chat, "m-1", "hello")
    assert answer.status == 200, await answer.text()
    edited = await answer.json()
    assert edited["status"] == "edited" and edited["seq"] == 1 and TIMESTAMP.match(edited["edited_at"])
    again = await edit(api, auth, "u-a", chat, "m-1", "hello")
    assert await again.json() == edited  # the same body again changes nothing

    (message,) = await read_all(api, auth, "u-b", chat)
    assert message["body"] == "hello" and message["edited_at"] == edited["edited_at"]
    assert list(message)[-1] == "edited_at"


async def test_only_the_sender_edits_a_message_not_recalled(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    await send(api, auth, "u-a", chat, "m-1", "hi")
    await send(api, auth, "u-a", chat, "m-2", "bye")
    await api.delete(f"/v2/conversations/{chat}/messages/m-2", headers=auth("u-a"))

    refusals = [
        await edit(api, auth, "u-b", chat, "m-1", "mine"),
        await edit(api, auth, "u-a", chat, "m-2", "back"),
        await edit(api, auth, "u-a", chat, "m-none", "x"),
        await edit(api, auth, "u-a", "c-none", "m-1", "x"),
        await edit(api, auth, "u-x", chat, "m-1", "x"),
    ]
    bodies = [await expect_problem(answer, 404, "NOT_FOUND") for answer in refusals]
    assert len({json.dumps(body, sort_keys=True) for body in bodies}) == 1
    await expect_problem(await edit(api, auth, "u-a", chat, "m-1", ""), 422, "VALIDATION_FAILED")
    too_long = await expect_problem(await edit(api, auth, "u-a", chat, "m-1", "x" * 7), 422, "VALIDATION_FAILED")
    assert too_long["errors"][0]["loc"] == ["body", "body"]  # the send's limit, 6 bytes by default

    assert await pool.fetchval("SELECT count(*) FROM message_edits") == 0
    assert await pool.fetchval("SELECT last_edit_version FROM conversations WHERE conversation_id = $1", chat) == 0
    (message,) = await read_all(api, auth, "u-a", chat)
    assert message["body"] == "hi" and "edited_at" not in message


async def test_an_export_shows_each_body_as_of_its_snapshot(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    await send(api, auth, "u-a", chat, "m-1", "one")
    await send(api, auth, "u-a", chat, "m-2", "two")
    first_edit = await (await edit(api, auth, "u-a", chat, "m-2", "two-a")).json()
    answer = await submit(api, auth, "u-a", chat, {"format": "jsonl"}, "k-snapshot")
    operation_id = (await answer.json())["operation_id"]
    async with pool.acquire() as conn:
        claim = await claims.claim_export(conn, operation_id, "w-test", lease_seconds=60, max_attempts=3)
    assert claim.claimed is not None
    before_edits = await read_all(api, auth, "u-a", chat)

    # Edits after the first claim fixed the snapshot: a retried attempt must still write the same bytes.
    await edit(api, auth, "u-a", chat, "m-1", "one-b")
    await edit(api, auth, "u-a", chat, "m-2", "two-b")
    await edit(api, auth, "u-a", chat, "m-2", "two-c")

    async with pool.acquire() as conn:
        rows = await export_reader.fetch_export_rows(
            conn, operation_id=operation_id, conversation_id=chat, after_seq=0, last_seq=2, request=ExportRequest()
        )
        lines = await export_reader.fetch_export_lines(
            conn, operation_id=operation_id, conversation_id=chat, after_seq=0, last_seq=2, request=ExportRequest()
        )
    assert lines == expected_file(before_edits)
    assert [(row.body, row.edited_at is not None) for row in rows] == [("one", False), ("two-a", True)]
    assert rows[1].line == json.dumps(before_edits[1], separators=(",", ":"), ensure_ascii=False)
    assert before_edits[1]["edited_at"] == first_edit["edited_at"]
    now = await read_all(api, auth, "u-a", chat)
    assert [message["body"] for message in now] == ["one-b", "two-c"]


async def test_replies_and_edits_show_in_every_format(api: Client, auth: Auth, pipeline: None) -> None:
    await make_conversation(api, auth, "c-fmt", ["alice", "bob"])
    await send(api, auth, "alice", "c-fmt", "m-1", "hi")
    await reply(api, auth, "bob", "c-fmt", "m-2", "yes", "m-1")
    edited_at = (await (await edit(api, auth, "bob", "c-fmt", "m-2", "yes!")).json())["edited_at"]
    messages = await read_all(api, auth, "alice", "c-fmt")

    files = await every_format(api, auth, "alice", "c-fmt")

    assert files["jsonl"] == expected_file(messages)
    header, first, second = csv_rows(files["csv"])
    assert header[5:8] == ["body", "reply_to", "edited_at"]
    assert first[5:8] == ["hi", "", ""] and second[5:8] == ["yes!", "m-1", edited_at]
    html = files["html"].decode()
    assert '<p class="reply">In reply to <span dir="auto">m-1</span></p>' in html
    assert f'(edited <time datetime="{edited_at}">' in html and html.count("(edited") == 1
    txt = files["txt"].decode().splitlines()
    assert txt[0].endswith("] alice: hi") and txt[1].endswith("] bob (reply to m-1) (edited): yes!")


async def test_a_replaced_body_is_kept_while_an_export_may_show_it(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    await send(api, auth, "u-a", chat, "m-1", "one")
    await edit(api, auth, "u-a", chat, "m-1", "one-a")
    answer = await submit(api, auth, "u-a", chat, {}, "k-prune")
    operation_id = (await answer.json())["operation_id"]

    async def prune() -> int:
        async with pool.acquire() as conn:
            return await message_store.prune_replaced_bodies(conn, limit=100)

    # Not yet claimed: its claim may fix an edit version older than an edit committing beside it.
    assert await prune() == 0
    async with pool.acquire() as conn:
        await claims.claim_export(conn, operation_id, "w-test", lease_seconds=60, max_attempts=3)
    assert await prune() == 1  # the edit before the snapshot: no export shows "one" any more
    await edit(api, auth, "u-a", chat, "m-1", "one-b")
    assert await prune() == 0  # "one-a" is what the claimed export shows
    await pool.execute("UPDATE operations SET state = 'FAILED_REPAIR' WHERE operation_id = $1", operation_id)
    assert await prune() == 0  # a requeue would write the file again
    await pool.execute("UPDATE operations SET state = 'FAILED' WHERE operation_id = $1", operation_id)
    assert await prune() == 1
    assert await pool.fetchval("SELECT count(*) FROM message_edits") == 0
