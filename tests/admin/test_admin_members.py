"""The admin conversation routes (docs/api.md: Administration, Admin): the member set put whole, and members added and
removed.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from tests.support.api_calls import expect_problem
from tests.support.messages import Auth, Client, read, send, stored

pytestmark = pytest.mark.module_database  # every test starts from empty tables (tests/conftest.py)


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

    problem = await expect_problem(response, 422, "VALIDATION_FAILED")
    assert loc in [error["loc"] for error in problem["errors"]]
    assert await stored(pool, "c-new") == (0, None)


async def test_admin_path_ids_that_break_the_syntax_are_422(api: Client, auth: Auth, chat: str) -> None:
    admin = auth("admin", admin=True)

    bad_cid = await api.put(f"/admin/conversations/{'c' * 65}", json={"members": []}, headers=admin)
    bad_uid = await api.put(f"/admin/conversations/{chat}/members/u%20x", headers=admin)

    assert (await expect_problem(bad_cid, 422, "VALIDATION_FAILED"))["errors"][0]["loc"] == ["path", "cid"]
    assert (await expect_problem(bad_uid, 422, "VALIDATION_FAILED"))["errors"][0]["loc"] == ["path", "uid"]


async def test_add_and_remove_member(api: Client, auth: Auth, chat: str, pool: asyncpg.Pool) -> None:
    admin = auth("admin", admin=True)

    added = [await api.put(f"/admin/conversations/{chat}/members/u-c", headers=admin) for _ in range(2)]
    assert await member_ids(pool, chat) == ["u-a", "u-b", "u-c"]
    assert (await send(api, auth, "u-c", chat, "m-1", "hi")).status == 200

    removed = [await api.delete(f"/admin/conversations/{chat}/members/u-a", headers=admin) for _ in range(2)]
    assert await member_ids(pool, chat) == ["u-b", "u-c"]

    assert [response.status for response in added + removed] == [204] * 4  # both idempotent
    await expect_problem(await read(api, auth, "u-a", chat), 404, "NOT_FOUND")


async def test_member_routes_on_a_missing_conversation_are_404(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    admin = auth("admin", admin=True)

    added = await api.put("/admin/conversations/c-none/members/u-a", headers=admin)
    removed = await api.delete("/admin/conversations/c-none/members/u-a", headers=admin)

    await expect_problem(added, 404, "CONVERSATION_NOT_FOUND")
    await expect_problem(removed, 404, "CONVERSATION_NOT_FOUND")
    assert await stored(pool, "c-none") == (0, None)  # not created by the member routes
