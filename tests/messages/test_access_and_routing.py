"""Who may call the message store and the admin routes: a non-member and a missing conversation get the
same 404, a bad token 401 with its challenge, a token without the admin scope 403; and the router's 405 and
404 problems.
"""

from __future__ import annotations

import json

import asyncpg
import jwt
import pytest

from shared.auth import mint_token
from shared.settings import Settings
from tests.support.api_calls import challenge, expect_problem, make_conversation
from tests.support.messages import Auth, Client, read, send, stored

pytestmark = pytest.mark.module_database  # every test starts from empty tables (tests/conftest.py)


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
        await expect_problem(response, 404, "NOT_FOUND")
        bodies.add(await response.read())
    assert len(bodies) == 1
    assert await stored(pool, chat) == (0, 0)


async def test_removed_member_can_no_longer_send_or_read(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    await make_conversation(api, auth, chat, ["u-a"])

    await expect_problem(await send(api, auth, "u-b", chat, "m-1", "hi"), 404, "NOT_FOUND")
    await expect_problem(await read(api, auth, "u-b", chat), 404, "NOT_FOUND")
    assert await stored(pool, chat) == (0, 0)


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
        await expect_problem(response, 401, "UNAUTHENTICATED")
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
        await expect_problem(response, 403, "FORBIDDEN")
    members = await pool.fetch("SELECT user_id FROM conversation_members WHERE conversation_id = $1 ORDER BY 1", chat)
    assert [row["user_id"] for row in members] == ["u-a", "u-b"]
    assert await stored(pool, chat) == (0, 0)


async def test_wrong_method_is_405_with_allow(api: Client, auth: Auth, chat: str) -> None:
    response = await api.patch(f"/v2/conversations/{chat}/messages", headers=auth("u-a"))

    await expect_problem(response, 405, "METHOD_NOT_ALLOWED")
    assert set(response.headers["Allow"].replace(" ", "").split(",")) >= {"GET", "POST"}


async def test_unknown_route_is_404_problem(api: Client, auth: Auth) -> None:
    for path in ("/nothing-here", "/v2/conversations/c-a/nothing"):
        await expect_problem(await api.get(path, headers=auth("u-a")), 404, "NOT_FOUND")
