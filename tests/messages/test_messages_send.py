"""Sending a message (docs/api.md: Message store, Send): what is stored and answered, and every refusal, which stores
nothing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest

from devtools.moto import MotoServer
from shared.settings import Settings
from tests.support.api_calls import expect_problem, make_conversation
from tests.support.messages import (
    TIMESTAMP,
    Auth,
    Client,
    configured_api,
    post_import,
    send,
    send_raw,
    stored,
)

pytestmark = pytest.mark.module_database  # every test starts from empty tables (tests/conftest.py)


async def test_send_stores_message_and_answers_seq_and_sent_at(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    first = await send(api, auth, "u-a", chat, "m-1", "hi")
    second = await send(api, auth, "u-b", chat, "m-2", "yo")

    assert first.status == 200
    body = await first.json()
    assert list(body) == ["status", "conversation_id", "message_id", "seq", "sent_at"]
    assert body["status"] == "stored"
    assert (body["conversation_id"], body["message_id"], body["seq"]) == ("c-a", "m-1", 1)
    assert TIMESTAMP.match(body["sent_at"])
    assert (await second.json())["seq"] == 2
    row = await pool.fetchrow("SELECT sender_id, body, sent_at FROM messages WHERE message_id = 'm-1'")
    assert (row["sender_id"], row["body"]) == ("u-a", "hi")
    assert row["sent_at"].microsecond % 1000 == 0  # stored at millisecond precision (docs/api.md: Message store, Send)


async def test_body_of_exactly_six_utf8_bytes_is_accepted(api: Client, auth: Auth, chat: str) -> None:
    response = await send(api, auth, "u-a", chat, "m-1", "€€")  # 2 x 3 bytes
    assert response.status == 200


@pytest.mark.parametrize(
    ("payload", "loc"),
    [
        ({"message_id": "m-1", "body": "1234567"}, ["body", "body"]),
        ({"message_id": "m-1", "body": "€€a"}, ["body", "body"]),  # 7 bytes in 3 characters
        ({"message_id": "m-1", "body": ""}, ["body", "body"]),
        ({"message_id": "m-1", "body": 5}, ["body", "body"]),
        ({"message_id": "", "body": "hi"}, ["body", "message_id"]),
        ({"message_id": "m" * 65, "body": "hi"}, ["body", "message_id"]),
        ({"message_id": "m-1"}, ["body", "body"]),
        ({"message_id": "m-1", "body": "hi", "extra": 1}, ["body", "extra"]),
        ({"message_id": "m-1", "body": "a\u0000b"}, ["body", "body"]),
        (["m-1", "hi"], ["body"]),
    ],
)
async def test_schema_violations_are_422_and_store_nothing(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool, payload: Any, loc: list[Any]
) -> None:
    response = await send_raw(api, auth, "u-a", chat, json.dumps(payload).encode(), "application/json")

    problem = await expect_problem(response, 422, "VALIDATION_FAILED")
    assert loc in [error["loc"] for error in problem["errors"]]
    assert await stored(pool, chat) == (0, 0)


async def test_refusals_never_echo_a_message_body(api: Client, auth: Auth, chat: str) -> None:
    too_long = await send(api, auth, "u-a", chat, "m-1", "secret!")
    bad_line = await post_import(api, auth, chat, [{"message_id": "h-1", "sender_id": "not valid", "body": "secret!"}])

    for response in (too_long, bad_line):
        await expect_problem(response, 422, "VALIDATION_FAILED")
        assert "secret!" not in await response.text()


async def test_lone_surrogate_sent_as_raw_json_text_is_422(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    response = await send_raw(api, auth, "u-a", chat, b'{"message_id": "m-1", "body": "\\ud800"}', "application/json")

    problem = await expect_problem(response, 422, "VALIDATION_FAILED")
    assert problem["errors"][0]["loc"] == ["body", "body"]
    assert await stored(pool, chat) == (0, 0)


@pytest.mark.parametrize(
    "data",
    [b'{"message_id": "m-1", "body": ', b'{"message_id": "m-1", "body": "\xff"}', b""],
    ids=["truncated", "not-utf8", "empty"],
)
async def test_malformed_body_is_400(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool, data: bytes) -> None:
    response = await send_raw(api, auth, "u-a", chat, data, "application/json")

    await expect_problem(response, 400, "MALFORMED_JSON")
    assert await stored(pool, chat) == (0, 0)


async def test_other_media_type_is_415(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    response = await send_raw(api, auth, "u-a", chat, b'{"message_id": "m-1", "body": "hi"}', "text/plain")

    await expect_problem(response, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert await stored(pool, chat) == (0, 0)


async def test_request_over_4096_bytes_is_413(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    at_limit = json.dumps({"message_id": "m-1", "body": "hi"}).encode()
    at_limit += b" " * (4096 - len(at_limit))
    over_limit = at_limit + b" "

    refused = await send_raw(api, auth, "u-a", chat, over_limit, "application/json")
    accepted = await send_raw(api, auth, "u-a", chat, at_limit, "application/json")

    await expect_problem(refused, 413, "PAYLOAD_TOO_LARGE")
    assert accepted.status == 200
    assert await stored(pool, chat) == (1, 1)


async def test_body_limit_is_configurable(
    api: Client, auth: Auth, chat: str, settings: Settings, moto: MotoServer
) -> None:
    async with configured_api(settings, moto, message_body_max_bytes=10) as roomier:
        accepted = await send(roomier, auth, "u-a", chat, "m-1", "0123456789")
        refused = await send(roomier, auth, "u-a", chat, "m-2", "0123456789a")

        assert accepted.status == 200
        await expect_problem(refused, 422, "VALIDATION_FAILED")


async def test_duplicate_message_id_is_409_even_with_identical_body_and_burns_no_seq(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    await send(api, auth, "u-a", chat, "m-1", "hi")

    same = await send(api, auth, "u-a", chat, "m-1", "hi")
    other_sender = await send(api, auth, "u-b", chat, "m-1", "yo")

    await expect_problem(same, 409, "DUPLICATE_MESSAGE_ID")
    await expect_problem(other_sender, 409, "DUPLICATE_MESSAGE_ID")
    assert await stored(pool, chat) == (1, 1)
    assert (await (await send(api, auth, "u-a", chat, "m-2", "hi")).json())["seq"] == 2


async def test_concurrent_sends_get_distinct_gapless_seqs(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    distinct = [send(api, auth, "u-a", chat, f"m-{n}", "x") for n in range(20)]
    same_id = [send(api, auth, "u-b", chat, "m-same", "x") for _ in range(5)]

    responses = await asyncio.gather(*distinct, *same_id)

    statuses = [response.status for response in responses]
    assert statuses[:20] == [200] * 20
    assert sorted(statuses[20:]) == [200, 409, 409, 409, 409]
    seqs = [(await response.json())["seq"] for response in responses if response.status == 200]
    assert sorted(seqs) == list(range(1, 22))
    assert await stored(pool, chat) == (21, 21)


async def test_recalled_message_id_stays_taken(api: Client, auth: Auth, chat: str) -> None:
    await send(api, auth, "u-a", chat, "m-1", "hi")
    recall = await api.delete(f"/v2/conversations/{chat}/messages/m-1", headers=auth("u-a"))
    assert recall.status == 200, await recall.text()
    assert await recall.json() == {"status": "recalled"}

    response = await send(api, auth, "u-a", chat, "m-1", "hi")

    await expect_problem(response, 409, "DUPLICATE_MESSAGE_ID")


async def test_same_message_id_in_another_conversation_is_stored(api: Client, auth: Auth, chat: str) -> None:
    await make_conversation(api, auth, "c-b", ["u-a"])
    await send(api, auth, "u-a", chat, "m-1", "hi")

    response = await send(api, auth, "u-a", "c-b", "m-1", "hi")

    assert response.status == 200
    assert (await response.json())["seq"] == 1  # seqs are per conversation
