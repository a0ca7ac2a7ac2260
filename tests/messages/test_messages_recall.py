"""Recalling a message (docs/api.md: Message store, Recall): only its sender may, it is marked and never deleted,
and reads skip it.
"""

from __future__ import annotations

import asyncpg
import pytest

from tests.support.api_calls import expect_problem, make_conversation
from tests.support.messages import Auth, Client, read, send

pytestmark = pytest.mark.module_database  # every test starts from empty tables (tests/conftest.py)


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
        await expect_problem(response, 404, "NOT_FOUND")
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
