"""The admin import of history (docs/api.md: Administration, Import): seqs in line order, idempotent per message
id, a bad line refuses the whole batch, and its limits, media types and line endings.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from devtools.moto import MotoServer
from shared.settings import Settings
from tests.support.api_calls import expect_problem
from tests.support.messages import TIMESTAMP, Auth, Client, configured_api, post_import, read, send, stored

pytestmark = pytest.mark.module_database  # every test starts from empty tables (tests/conftest.py)


def history(count: int, *, start: int = 1) -> list[dict[str, Any]]:
    return [
        {"message_id": f"h-{n}", "sender_id": "u-a" if n % 2 else "u-old", "body": f"line {n}"}
        for n in range(start, start + count)
    ]


async def test_import_assigns_seqs_in_line_order(api: Client, auth: Auth, chat: str) -> None:
    lines = [
        {"message_id": "z", "sender_id": "u-old", "body": "first", "sent_at": "2020-01-02T03:04:05.678901+02:00"},
        {"message_id": "a", "sender_id": "u-a", "body": "a body longer than six bytes"},
        {"message_id": "m", "sender_id": "u-b", "body": "third", "sent_at": None},
    ]

    response = await post_import(api, auth, chat, lines)
    page = await (await read(api, auth, "u-a", chat)).json()

    assert response.status == 200
    assert await response.json() == {"imported": 3, "skipped": 0}
    assert [(m["seq"], m["message_id"], m["sender_id"]) for m in page["messages"]] == [
        (1, "z", "u-old"),
        (2, "a", "u-a"),
        (3, "m", "u-b"),
    ]
    assert page["messages"][0]["sent_at"] == "2020-01-02T01:04:05.678Z"
    assert all(TIMESTAMP.match(message["sent_at"]) for message in page["messages"])


async def test_import_is_idempotent_per_message_id(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    await send(api, auth, "u-a", chat, "h-2", "live")  # seq 1, already stored

    first = await post_import(
        api, auth, chat, [*history(3), {"message_id": "h-1", "sender_id": "u-b", "body": "again"}]
    )
    second = await post_import(api, auth, chat, history(5))
    after = await send(api, auth, "u-a", chat, "m-live", "next")

    assert await first.json() == {"imported": 2, "skipped": 2}  # h-2 stored before, h-1 repeated in the batch
    assert await second.json() == {"imported": 2, "skipped": 3}
    rows = await pool.fetch("SELECT seq, message_id, body FROM messages WHERE conversation_id = $1 ORDER BY seq", chat)
    assert [(row["seq"], row["message_id"]) for row in rows] == [
        (1, "h-2"),
        (2, "h-1"),
        (3, "h-3"),
        (4, "h-4"),
        (5, "h-5"),
        (6, "m-live"),
    ]
    assert rows[1]["body"] == "line 1"  # the first occurrence wins
    assert (await after.json())["seq"] == 6
    assert await stored(pool, chat) == (6, 6)


@pytest.mark.parametrize(
    ("bad_line", "loc"),
    [
        ({"message_id": "h-3", "sender_id": "u-a"}, ["body", 3, "body"]),
        ({"message_id": "h-3", "sender_id": "u a", "body": "x"}, ["body", 3, "sender_id"]),
        ({"message_id": "h-3", "sender_id": "u-a", "body": ""}, ["body", 3, "body"]),
        ({"message_id": "h-3", "sender_id": "u-a", "body": "x\u0000"}, ["body", 3, "body"]),
        ({"message_id": "h-3", "sender_id": "u-a", "body": "x", "sent_at": "yesterday"}, ["body", 3, "sent_at"]),
        (
            {"message_id": "h-3", "sender_id": "u-a", "body": "x", "sent_at": "2020-01-01T00:00:00"},
            ["body", 3, "sent_at"],
        ),
        ({"message_id": "h-3", "sender_id": "u-a", "body": "x", "seq": 9}, ["body", 3, "seq"]),
        ('{"message_id": "h-3", "sender_id": "u-a", "body": "\\udc00"}', ["body", 3]),
        (b'{"message_id": "h-3", "sender_id": "u-a", "body": "\xff"}', ["body", 3]),
        ('{"message_id": "h-3",', ["body", 3]),
        ("", ["body", 3]),
        ("[1, 2]", ["body", 3]),
    ],
)
async def test_a_bad_line_rejects_the_whole_batch_naming_it(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool, bad_line: Any, loc: list[Any]
) -> None:
    lines = [*history(2), bad_line, *history(2, start=4)]

    response = await post_import(api, auth, chat, lines)

    problem = await expect_problem(response, 422, "VALIDATION_FAILED")
    assert loc in [error["loc"] for error in problem["errors"]]
    assert "Line 3" in problem["detail"]
    assert await stored(pool, chat) == (0, 0)


async def test_import_body_limit_is_64_kib_not_6_bytes(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    biggest = {"message_id": "big", "sender_id": "u-a", "body": "é" * (32 * 1024)}  # 65536 bytes
    too_big = {"message_id": "bigger", "sender_id": "u-a", "body": "é" * (32 * 1024) + "x"}

    refused = await post_import(api, auth, chat, [too_big])
    accepted = await post_import(api, auth, chat, [biggest])

    problem = await expect_problem(refused, 422, "VALIDATION_FAILED")
    assert problem["errors"][0]["loc"] == ["body", 1, "body"]
    assert await accepted.json() == {"imported": 1, "skipped": 0}
    assert await stored(pool, chat) == (1, 1)


async def test_import_into_a_missing_conversation_is_404(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    response = await post_import(api, auth, "c-none", history(2))

    await expect_problem(response, 404, "CONVERSATION_NOT_FOUND")
    assert await stored(pool, "c-none") == (0, None)


async def test_import_media_types(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    refused = await post_import(api, auth, chat, history(1), content_type="text/plain")
    as_json = await post_import(api, auth, chat, history(1), content_type="application/json")

    await expect_problem(refused, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert await as_json.json() == {"imported": 1, "skipped": 0}
    assert await stored(pool, chat) == (1, 1)


async def test_import_line_endings(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    lines = [json.dumps(line) for line in history(3)]
    headers = {**auth("admin", admin=True), "Content-Type": "application/x-ndjson"}
    url = f"/admin/conversations/{chat}/messages:import"

    crlf_and_trailing_blanks = await api.post(url, data=("\r\n".join(lines) + "\r\n\n\n").encode(), headers=headers)
    no_final_newline = await api.post(url, data="\n".join(lines).encode(), headers=headers)
    empty = await api.post(url, data=b"", headers=headers)

    assert await crlf_and_trailing_blanks.json() == {"imported": 3, "skipped": 0}
    assert await no_final_newline.json() == {"imported": 0, "skipped": 3}
    assert await empty.json() == {"imported": 0, "skipped": 0}
    assert await stored(pool, chat) == (3, 3)


async def test_import_over_the_request_limit_is_413(
    api: Client, auth: Auth, chat: str, settings: Settings, moto: MotoServer, pool: asyncpg.Pool
) -> None:
    data = "".join(json.dumps(line) + "\n" for line in history(3)).encode()
    headers = {**auth("admin", admin=True), "Content-Type": "application/x-ndjson"}
    url = f"/admin/conversations/{chat}/messages:import"

    async with configured_api(settings, moto, import_request_max_bytes=len(data)) as small:
        accepted = await small.post(url, data=data, headers=headers)
        refused = await small.post(url, data=data + b"\n", headers=headers)

        assert await accepted.json() == {"imported": 3, "skipped": 0}
        await expect_problem(refused, 413, "PAYLOAD_TOO_LARGE")
    assert await stored(pool, chat) == (3, 3)


async def test_import_of_20000_lines(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    response = await post_import(api, auth, chat, history(20_000))
    again = await post_import(api, auth, chat, history(20_000, start=10_001))

    assert await response.json() == {"imported": 20_000, "skipped": 0}
    assert await again.json() == {"imported": 10_000, "skipped": 10_000}
    assert await stored(pool, chat) == (30_000, 30_000)
    gaps = await pool.fetchval(
        "SELECT count(*) FROM messages WHERE conversation_id = $1 AND seq <> substr(message_id, 3)::bigint", chat
    )
    assert gaps == 0  # line order is seq order, no gaps


@pytest.mark.parametrize("blank", [" \t\r", "\x0b", "\x0c", "\x1c", "\u00a0"])
async def test_only_json_whitespace_makes_a_trailing_line_blank(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool, blank: str
) -> None:
    """A line is blank when it holds only what JSON itself skips (space, tab, CR), as inside a line: a
    trailing line of any other white space is a bad line, as it would be anywhere else.
    """
    lines = [json.dumps(line) for line in history(2)]
    headers = {**auth("admin", admin=True), "Content-Type": "application/x-ndjson"}
    body = ("\n".join([*lines, blank]) + "\n").encode()

    response = await api.post(f"/admin/conversations/{chat}/messages:import", data=body, headers=headers)

    if blank == " \t\r":
        assert await response.json() == {"imported": 2, "skipped": 0}
        assert await stored(pool, chat) == (2, 2)
    else:
        problem = await expect_problem(response, 422, "VALIDATION_FAILED")
        assert problem["errors"][0]["loc"][:2] == ["body", 3]
        assert await stored(pool, chat) == (0, 0)
