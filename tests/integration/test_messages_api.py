"""The message store over HTTP (contract sections 3 and 4), on the real app and a real Postgres database."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import jwt
import pytest
from aiohttp.test_utils import TestClient, TestServer

from devtools.moto import MotoServer
from services.api.app import init_app
from services.api.keys import POOL
from shared.auth import mint_token
from shared.settings import Settings
from tests.conftest import PG_SERVER, make_settings, wait_for
from tests.helpers import challenge, import_lines, make_conversation

pytestmark = pytest.mark.integration

Client = TestClient[Any, Any]
Auth = Callable[..., dict[str, str]]

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
LINE_KEYS = ["conversation_id", "seq", "message_id", "sender_id", "sent_at", "body"]
PROBLEM_TYPE = "application/problem+json"


# --- helpers -------------------------------------------------------------------------------------------


async def send(api: Client, auth: Auth, user: str, cid: str, message_id: str, body: str) -> Any:
    return await api.post(
        f"/v2/conversations/{cid}/messages", json={"message_id": message_id, "body": body}, headers=auth(user)
    )


async def send_raw(api: Client, auth: Auth, user: str, cid: str, data: bytes, content_type: str) -> Any:
    headers = {**auth(user), "Content-Type": content_type}
    return await api.post(f"/v2/conversations/{cid}/messages", data=data, headers=headers)


async def read(api: Client, auth: Auth, user: str, cid: str, **query: Any) -> Any:
    return await api.get(f"/v2/conversations/{cid}/messages", params=query, headers=auth(user))


def ndjson(lines: list[Any]) -> bytes:
    """One line per item: a dict is dumped as JSON, a str is sent as its text, bytes as they are."""
    return b"".join(_encoded(line) + b"\n" for line in lines)


def _encoded(line: Any) -> bytes:
    if isinstance(line, bytes):
        return line
    return (line if isinstance(line, str) else json.dumps(line)).encode()


async def post_import(api: Client, auth: Auth, cid: str, lines: list[Any], *, content_type: str | None = None) -> Any:
    headers = {**auth("admin", admin=True), "Content-Type": content_type or "application/x-ndjson"}
    return await api.post(f"/admin/conversations/{cid}/messages:import", data=ndjson(lines), headers=headers)


async def stored(pool: asyncpg.Pool, cid: str) -> tuple[int, int | None]:
    """(number of message rows, conversations.last_seq) of ``cid``; last_seq is None without the row."""
    count = await pool.fetchval("SELECT count(*) FROM messages WHERE conversation_id = $1", cid)
    last_seq = await pool.fetchval("SELECT last_seq FROM conversations WHERE conversation_id = $1", cid)
    return count, last_seq


async def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status == status, await response.text()
    assert response.content_type == PROBLEM_TYPE
    problem: dict[str, Any] = await response.json()
    assert problem["status"] == status
    assert problem["code"] == code
    assert {"type", "title", "detail"} <= problem.keys()
    return problem


@asynccontextmanager
async def configured_api(settings: Settings, moto: MotoServer, **overrides: Any) -> AsyncIterator[Client]:
    """Another instance of the app on this test's database, with some settings changed."""
    client: Client = TestClient(
        TestServer(init_app(make_settings(settings.database_url, moto.endpoint_url, **overrides)))
    )
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def chat(api: Client, auth: Auth) -> str:
    """Conversation ``c-a`` with members ``u-a`` and ``u-b``."""
    await make_conversation(api, auth, "c-a", ["u-a", "u-b"])
    return "c-a"


# --- send ----------------------------------------------------------------------------------------------


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
    assert row["sent_at"].microsecond % 1000 == 0  # stored at millisecond precision (5.6)


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

    problem = await assert_problem(response, 422, "VALIDATION_FAILED")
    assert loc in [error["loc"] for error in problem["errors"]]
    assert await stored(pool, chat) == (0, 0)


async def test_refusals_never_echo_a_message_body(api: Client, auth: Auth, chat: str) -> None:
    too_long = await send(api, auth, "u-a", chat, "m-1", "secret!")
    bad_line = await post_import(api, auth, chat, [{"message_id": "h-1", "sender_id": "not valid", "body": "secret!"}])

    for response in (too_long, bad_line):
        await assert_problem(response, 422, "VALIDATION_FAILED")
        assert "secret!" not in await response.text()


async def test_lone_surrogate_sent_as_raw_json_text_is_422(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    response = await send_raw(api, auth, "u-a", chat, b'{"message_id": "m-1", "body": "\\ud800"}', "application/json")

    problem = await assert_problem(response, 422, "VALIDATION_FAILED")
    assert problem["errors"][0]["loc"] == ["body", "body"]
    assert await stored(pool, chat) == (0, 0)


@pytest.mark.parametrize(
    "data",
    [b'{"message_id": "m-1", "body": ', b'{"message_id": "m-1", "body": "\xff"}', b""],
    ids=["truncated", "not-utf8", "empty"],
)
async def test_malformed_body_is_400(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool, data: bytes) -> None:
    response = await send_raw(api, auth, "u-a", chat, data, "application/json")

    await assert_problem(response, 400, "MALFORMED_JSON")
    assert await stored(pool, chat) == (0, 0)


async def test_other_media_type_is_415(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    response = await send_raw(api, auth, "u-a", chat, b'{"message_id": "m-1", "body": "hi"}', "text/plain")

    await assert_problem(response, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert await stored(pool, chat) == (0, 0)


async def test_request_over_4096_bytes_is_413(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    at_limit = json.dumps({"message_id": "m-1", "body": "hi"}).encode()
    at_limit += b" " * (4096 - len(at_limit))
    over_limit = at_limit + b" "

    refused = await send_raw(api, auth, "u-a", chat, over_limit, "application/json")
    accepted = await send_raw(api, auth, "u-a", chat, at_limit, "application/json")

    await assert_problem(refused, 413, "PAYLOAD_TOO_LARGE")
    assert accepted.status == 200
    assert await stored(pool, chat) == (1, 1)


async def test_body_limit_is_configurable(
    api: Client, auth: Auth, chat: str, settings: Settings, moto: MotoServer
) -> None:
    async with configured_api(settings, moto, message_body_max_bytes=10) as roomier:
        accepted = await send(roomier, auth, "u-a", chat, "m-1", "0123456789")
        refused = await send(roomier, auth, "u-a", chat, "m-2", "0123456789a")

        assert accepted.status == 200
        await assert_problem(refused, 422, "VALIDATION_FAILED")


async def test_duplicate_message_id_is_409_even_with_identical_body_and_burns_no_seq(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    await send(api, auth, "u-a", chat, "m-1", "hi")

    same = await send(api, auth, "u-a", chat, "m-1", "hi")
    other_sender = await send(api, auth, "u-b", chat, "m-1", "yo")

    await assert_problem(same, 409, "DUPLICATE_MESSAGE_ID")
    await assert_problem(other_sender, 409, "DUPLICATE_MESSAGE_ID")
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
    await api.delete(f"/v2/conversations/{chat}/messages/m-1", headers=auth("u-a"))

    response = await send(api, auth, "u-a", chat, "m-1", "hi")

    await assert_problem(response, 409, "DUPLICATE_MESSAGE_ID")


async def test_same_message_id_in_another_conversation_is_stored(api: Client, auth: Auth, chat: str) -> None:
    await make_conversation(api, auth, "c-b", ["u-a"])
    await send(api, auth, "u-a", chat, "m-1", "hi")

    response = await send(api, auth, "u-a", "c-b", "m-1", "hi")

    assert response.status == 200
    assert (await response.json())["seq"] == 1  # seqs are per conversation


# --- 404: not a member, or no such conversation ----------------------------------------------------------


async def test_non_member_and_missing_conversation_get_identical_404(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    answers = [
        await send(api, auth, "u-stranger", chat, "m-1", "hi"),
        await send(api, auth, "u-a", "c-missing", "m-1", "hi"),
        await send(api, auth, "u-a", "c" * 65, "m-1", "hi"),
        await send(api, auth, "u-a", "c%00a", "m-1", "hi"),
        await read(api, auth, "u-stranger", chat),
        await read(api, auth, "u-a", "c-missing"),
    ]

    bodies = set()
    for response in answers:
        await assert_problem(response, 404, "NOT_FOUND")
        bodies.add(await response.read())
    assert len(bodies) == 1
    assert await stored(pool, chat) == (0, 0)


async def test_removed_member_can_no_longer_send_or_read(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    await make_conversation(api, auth, chat, ["u-a"])

    await assert_problem(await send(api, auth, "u-b", chat, "m-1", "hi"), 404, "NOT_FOUND")
    await assert_problem(await read(api, auth, "u-b", chat), 404, "NOT_FOUND")
    assert await stored(pool, chat) == (0, 0)


# --- read ----------------------------------------------------------------------------------------------


async def test_read_returns_export_lines_in_seq_order(api: Client, auth: Auth, chat: str) -> None:
    sent = [
        await (await send(api, auth, user, chat, f"m-{n}", text)).json()
        for n, user, text in [
            (1, "u-a", "hi"),
            (2, "u-b", "ça va"),
            (3, "u-a", "🙂"),
        ]
    ]

    response = await read(api, auth, "u-b", chat)

    assert response.status == 200
    page = await response.json()
    assert page["next_after_seq"] is None
    assert [list(message) for message in page["messages"]] == [LINE_KEYS] * 3
    assert page["messages"] == [
        {
            "conversation_id": chat,
            "seq": 1,
            "message_id": "m-1",
            "sender_id": "u-a",
            "sent_at": sent[0]["sent_at"],
            "body": "hi",
        },
        {
            "conversation_id": chat,
            "seq": 2,
            "message_id": "m-2",
            "sender_id": "u-b",
            "sent_at": sent[1]["sent_at"],
            "body": "ça va",
        },
        {
            "conversation_id": chat,
            "seq": 3,
            "message_id": "m-3",
            "sender_id": "u-a",
            "sent_at": sent[2]["sent_at"],
            "body": "🙂",
        },
    ]


async def test_read_pages_with_next_after_seq(api: Client, auth: Auth, chat: str) -> None:
    for n in range(1, 6):
        await send(api, auth, "u-a", chat, f"m-{n}", "x")

    pages = []
    after_seq: int | None = 0
    while after_seq is not None:
        page = await (await read(api, auth, "u-a", chat, after_seq=after_seq, limit=2)).json()
        pages.append([message["seq"] for message in page["messages"]])
        after_seq = page["next_after_seq"]
    exact = await (await read(api, auth, "u-a", chat, after_seq=1, limit=4)).json()

    assert pages == [[1, 2], [3, 4], [5]]
    # Exactly `limit` messages left: null, since nothing followed them when the page was read.
    assert [message["seq"] for message in exact["messages"]] == [2, 3, 4, 5]
    assert exact["next_after_seq"] is None


async def test_read_default_limit_is_100_and_max_is_1000(api: Client, auth: Auth, chat: str) -> None:
    lines = [{"message_id": f"m-{n}", "sender_id": "u-a", "body": "x"} for n in range(1, 1102)]
    await import_lines(api, auth, chat, lines)

    default = await (await read(api, auth, "u-a", chat)).json()
    biggest = await (await read(api, auth, "u-a", chat, limit=1000)).json()

    assert len(default["messages"]) == 100
    assert default["next_after_seq"] == 100
    assert len(biggest["messages"]) == 1000
    assert biggest["next_after_seq"] == 1000


@pytest.mark.parametrize(
    ("query", "loc"),
    [
        ({"limit": "0"}, ["query", "limit"]),
        ({"limit": "1001"}, ["query", "limit"]),
        ({"limit": "abc"}, ["query", "limit"]),
        ({"limit": "1.0"}, ["query", "limit"]),
        ({"limit": "+5"}, ["query", "limit"]),
        ({"after_seq": "-1"}, ["query", "after_seq"]),
        ({"after_seq": "9223372036854775808"}, ["query", "after_seq"]),
        ({"after": "5"}, ["query", "after"]),
    ],
)
async def test_bad_query_is_422_naming_the_parameter(
    api: Client, auth: Auth, chat: str, query: dict[str, str], loc: list[str]
) -> None:
    response = await read(api, auth, "u-a", chat, **query)

    problem = await assert_problem(response, 422, "VALIDATION_FAILED")
    assert [error["loc"] for error in problem["errors"]] == [loc]


# --- recall --------------------------------------------------------------------------------------------


async def test_sender_recalls_and_recalled_messages_are_not_read(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    for n in (1, 2, 3):
        await send(api, auth, "u-a", chat, f"m-{n}", "x")

    first = await api.delete(f"/v2/conversations/{chat}/messages/m-2", headers=auth("u-a"))
    again = await api.delete(f"/v2/conversations/{chat}/messages/m-2", headers=auth("u-a"))
    page = await (await read(api, auth, "u-b", chat)).json()

    assert first.status == 200
    assert await first.json() == {"status": "recalled"}
    assert again.status == 200  # idempotent for the sender
    assert [message["seq"] for message in page["messages"]] == [1, 3]
    row = await pool.fetchrow("SELECT recalled_at FROM messages WHERE conversation_id = $1 AND seq = 2", chat)
    assert row["recalled_at"] is not None  # marked, never deleted


async def test_recall_by_anyone_else_is_the_same_404(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    await send(api, auth, "u-a", chat, "m-1", "x")

    answers = [
        await api.delete(f"/v2/conversations/{chat}/messages/m-1", headers=auth("u-b")),
        await api.delete(f"/v2/conversations/{chat}/messages/m-1", headers=auth("admin", admin=True)),
        await api.delete(f"/v2/conversations/{chat}/messages/m-none", headers=auth("u-a")),
        await api.delete("/v2/conversations/c-missing/messages/m-1", headers=auth("u-a")),
        await api.delete(f"/v2/conversations/{chat}/messages/m%00", headers=auth("u-a")),
    ]

    bodies = set()
    for response in answers:
        await assert_problem(response, 404, "NOT_FOUND")
        bodies.add(await response.read())
    assert len(bodies) == 1
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE recalled_at IS NOT NULL") == 0


async def test_sender_who_left_may_still_recall(api: Client, auth: Auth, chat: str) -> None:
    await send(api, auth, "u-b", chat, "m-1", "x")
    await make_conversation(api, auth, chat, ["u-a"])

    response = await api.delete(f"/v2/conversations/{chat}/messages/m-1", headers=auth("u-b"))
    page = await (await read(api, auth, "u-a", chat)).json()

    assert response.status == 200
    assert page["messages"] == []


async def test_message_id_with_slash_and_emoji_can_be_recalled(api: Client, auth: Auth, chat: str) -> None:
    await send(api, auth, "u-a", chat, "a/😀", "x")

    response = await api.delete(f"/v2/conversations/{chat}/messages/a%2F%F0%9F%98%80", headers=auth("u-a"))

    assert response.status == 200


# --- authentication, authorization, routing ----------------------------------------------------------


def _tokens(settings: Settings) -> dict[str, str | None]:
    return {
        "missing": None,
        "not-bearer": f"Basic {mint_token(settings, user_id='u-a')}",
        "malformed": "Bearer not.a.jwt",
        "expired": f"Bearer {mint_token(settings, user_id='u-a', ttl_seconds=-60)}",
        "badly-signed": "Bearer "
        + jwt.encode(
            {"sub": "u-a", "exp": 4102444800}, "another-secret-that-is-long-enough-for-hs256", algorithm="HS256"
        ),
    }


@pytest.mark.parametrize("kind", ["missing", "not-bearer", "malformed", "expired", "badly-signed"])
async def test_bad_token_is_401_with_www_authenticate(
    api: Client, auth: Auth, chat: str, settings: Settings, pool: asyncpg.Pool, kind: str
) -> None:
    authorization = _tokens(settings)[kind]
    headers = {"Authorization": authorization} if authorization else {}

    responses = [
        await api.post(f"/v2/conversations/{chat}/messages", json={"message_id": "m-1", "body": "hi"}, headers=headers),
        await api.get(f"/v2/conversations/{chat}/messages", headers=headers),
        await api.put(f"/admin/conversations/{chat}", json={"members": ["u-x"]}, headers=headers),
    ]

    for response in responses:
        await assert_problem(response, 401, "UNAUTHENTICATED")
        assert response.headers["WWW-Authenticate"] == challenge("expired" if kind == "expired" else "invalid")
    assert await stored(pool, chat) == (0, 0)
    assert await pool.fetchval("SELECT count(*) FROM conversation_members WHERE user_id = 'u-x'") == 0


async def test_admin_routes_need_the_admin_scope(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    member = auth("u-a")
    ndjson = {**member, "Content-Type": "application/x-ndjson"}
    line = json.dumps({"message_id": "m-1", "sender_id": "u-a", "body": "hi"}).encode()

    responses = [
        await api.put(f"/admin/conversations/{chat}", json={"members": ["u-a"]}, headers=member),
        await api.put(f"/admin/conversations/{chat}/members/u-x", headers=member),
        await api.delete(f"/admin/conversations/{chat}/members/u-b", headers=member),
        await api.post(f"/admin/conversations/{chat}/messages:import", data=line, headers=ndjson),
    ]

    for response in responses:
        await assert_problem(response, 403, "FORBIDDEN")
    members = await pool.fetch("SELECT user_id FROM conversation_members WHERE conversation_id = $1 ORDER BY 1", chat)
    assert [row["user_id"] for row in members] == ["u-a", "u-b"]
    assert await stored(pool, chat) == (0, 0)


async def test_wrong_method_is_405_with_allow(api: Client, auth: Auth, chat: str) -> None:
    response = await api.patch(f"/v2/conversations/{chat}/messages", headers=auth("u-a"))

    await assert_problem(response, 405, "METHOD_NOT_ALLOWED")
    assert set(response.headers["Allow"].replace(" ", "").split(",")) >= {"GET", "POST"}


async def test_unknown_route_is_404_problem(api: Client, auth: Auth) -> None:
    for path in ("/nothing-here", "/v2/conversations/c-a/nothing"):
        await assert_problem(await api.get(path, headers=auth("u-a")), 404, "NOT_FOUND")


# --- admin: members --------------------------------------------------------------------------------------


async def member_ids(pool: asyncpg.Pool, cid: str) -> list[str]:
    rows = await pool.fetch("SELECT user_id FROM conversation_members WHERE conversation_id = $1 ORDER BY 1", cid)
    return [row["user_id"] for row in rows]


async def test_put_conversation_creates_then_replaces_member_set(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    admin = auth("admin", admin=True)
    url = "/admin/conversations/c-new"

    created = await api.put(url, json={"members": ["u-a", "u-b", "u-a"]}, headers=admin)
    assert await member_ids(pool, "c-new") == ["u-a", "u-b"]
    replaced = await api.put(url, json={"members": ["u-b", "u-c"]}, headers=admin)
    assert await member_ids(pool, "c-new") == ["u-b", "u-c"]
    emptied = await api.put(url, json={"members": []}, headers=admin)
    assert await member_ids(pool, "c-new") == []

    assert [response.status for response in (created, replaced, emptied)] == [204] * 3
    assert await stored(pool, "c-new") == (0, 0)  # the conversation stays


@pytest.mark.parametrize(
    ("payload", "loc"),
    [
        ({"members": ["bad id"]}, ["body", "members", 0]),
        ({"members": ["u" * 65]}, ["body", "members", 0]),
        ({"members": "u-a"}, ["body", "members"]),
        ({"members": ["u-a"], "owner": "u-a"}, ["body", "owner"]),
        ({"members": [f"u-{n}" for n in range(10_001)]}, ["body", "members"]),
    ],
)
async def test_put_conversation_rejects_bad_member_sets(
    api: Client, auth: Auth, pool: asyncpg.Pool, payload: Any, loc: list[Any]
) -> None:
    response = await api.put("/admin/conversations/c-new", json=payload, headers=auth("admin", admin=True))

    problem = await assert_problem(response, 422, "VALIDATION_FAILED")
    assert loc in [error["loc"] for error in problem["errors"]]
    assert await stored(pool, "c-new") == (0, None)


async def test_admin_path_ids_that_break_the_syntax_are_422(api: Client, auth: Auth, chat: str) -> None:
    admin = auth("admin", admin=True)

    bad_cid = await api.put(f"/admin/conversations/{'c' * 65}", json={"members": []}, headers=admin)
    bad_uid = await api.put(f"/admin/conversations/{chat}/members/u%20x", headers=admin)

    assert (await assert_problem(bad_cid, 422, "VALIDATION_FAILED"))["errors"][0]["loc"] == ["path", "cid"]
    assert (await assert_problem(bad_uid, 422, "VALIDATION_FAILED"))["errors"][0]["loc"] == ["path", "uid"]


async def test_add_and_remove_member(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    admin = auth("admin", admin=True)

    added = [await api.put(f"/admin/conversations/{chat}/members/u-c", headers=admin) for _ in range(2)]
    assert await member_ids(pool, chat) == ["u-a", "u-b", "u-c"]
    assert (await send(api, auth, "u-c", chat, "m-1", "hi")).status == 200

    removed = [await api.delete(f"/admin/conversations/{chat}/members/u-a", headers=admin) for _ in range(2)]
    assert await member_ids(pool, chat) == ["u-b", "u-c"]

    assert [response.status for response in added + removed] == [204] * 4  # both idempotent
    await assert_problem(await read(api, auth, "u-a", chat), 404, "NOT_FOUND")


async def test_member_routes_on_a_missing_conversation_are_404(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    admin = auth("admin", admin=True)

    added = await api.put("/admin/conversations/c-none/members/u-a", headers=admin)
    removed = await api.delete("/admin/conversations/c-none/members/u-a", headers=admin)

    await assert_problem(added, 404, "CONVERSATION_NOT_FOUND")
    await assert_problem(removed, 404, "CONVERSATION_NOT_FOUND")
    assert await stored(pool, "c-none") == (0, None)  # not created by the member routes


# --- admin: import -------------------------------------------------------------------------------------


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

    problem = await assert_problem(response, 422, "VALIDATION_FAILED")
    assert loc in [error["loc"] for error in problem["errors"]]
    assert "Line 3" in problem["detail"]
    assert await stored(pool, chat) == (0, 0)


async def test_import_body_limit_is_64_kib_not_6_bytes(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    biggest = {"message_id": "big", "sender_id": "u-a", "body": "é" * (32 * 1024)}  # 65536 bytes
    too_big = {"message_id": "bigger", "sender_id": "u-a", "body": "é" * (32 * 1024) + "x"}

    refused = await post_import(api, auth, chat, [too_big])
    accepted = await post_import(api, auth, chat, [biggest])

    problem = await assert_problem(refused, 422, "VALIDATION_FAILED")
    assert problem["errors"][0]["loc"] == ["body", 1, "body"]
    assert await accepted.json() == {"imported": 1, "skipped": 0}
    assert await stored(pool, chat) == (1, 1)


async def test_import_into_a_missing_conversation_is_404(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    response = await post_import(api, auth, "c-none", history(2))

    await assert_problem(response, 404, "CONVERSATION_NOT_FOUND")
    assert await stored(pool, "c-none") == (0, None)


async def test_import_media_types(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    refused = await post_import(api, auth, chat, history(1), content_type="text/plain")
    as_json = await post_import(api, auth, chat, history(1), content_type="application/json")

    await assert_problem(refused, 415, "UNSUPPORTED_MEDIA_TYPE")
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
        await assert_problem(refused, 413, "PAYLOAD_TOO_LARGE")
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


# --- health --------------------------------------------------------------------------------------------


async def test_healthz_and_readyz(api: Client) -> None:
    health = await api.get("/healthz")
    ready = await api.get("/readyz")

    assert (health.status, await health.json()) == (200, {"status": "ok"})
    assert (ready.status, await ready.json()) == (
        200,
        {"status": "ready", "checks": {"database": "ok", "storage": "ok"}},
    )


async def test_readyz_is_503_while_the_database_refuses_connections(api: Client, settings: Settings) -> None:
    database = settings.database_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(f"{PG_SERVER}/postgres")
    try:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", database)
        await wait_for(lambda: admin.fetchval("SELECT count(*) = 0 FROM pg_stat_activity WHERE datname = $1", database))

        refused = await api.get("/readyz")

        await assert_problem(refused, 503, "SERVICE_UNAVAILABLE")
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()
    assert (await api.get("/readyz")).status == 200  # recovers by itself


async def test_readyz_is_503_when_no_connection_answers_in_time(settings: Settings, moto: MotoServer) -> None:
    async with configured_api(settings, moto, database_pool_max=1) as client:
        async with client.app[POOL].acquire():  # the only connection is busy for longer than the 2 s budget
            response = await client.get("/readyz")

        await assert_problem(response, 503, "SERVICE_UNAVAILABLE")
