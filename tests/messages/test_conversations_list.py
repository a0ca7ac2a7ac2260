"""The caller's conversations (docs/api.md: Message store, Conversations): only those they are a
member of, by id, in pages, with the last seq and the time of the newest message not recalled.
"""

from __future__ import annotations

import pytest

from tests.support.api_calls import expect_problem, make_conversation
from tests.support.messages import Auth, Client, post_import

pytestmark = pytest.mark.module_database  # every test starts from empty tables (tests/conftest.py)

SENT = "2026-11-30T08:00:00.000Z"
LATER = "2026-11-30T09:30:00.000Z"


async def test_pages_of_the_callers_conversations(api: Client, auth: Auth) -> None:
    for cid, members in (("c-3", ["alice"]), ("c-1", ["alice", "bob"]), ("c-2", ["alice"]), ("c-bob", ["bob"])):
        await make_conversation(api, auth, cid, members)
    lines = [
        {"message_id": "m1", "sender_id": "alice", "body": "x", "sent_at": SENT},
        {"message_id": "m2", "sender_id": "alice", "body": "y", "sent_at": LATER},
    ]
    assert (await post_import(api, auth, "c-1", lines)).status == 200
    assert (await post_import(api, auth, "c-3", lines)).status == 200
    recalled = await api.delete("/v2/conversations/c-3/messages/m2", headers=auth("alice"))
    assert recalled.status == 200

    first = await api.get("/v2/conversations?limit=2", headers=auth("alice"))
    assert first.headers["Cache-Control"] == "no-store"
    page = await first.json()
    assert page["conversations"] == [
        {"conversation_id": "c-1", "last_seq": 2, "last_message_at": LATER},
        {"conversation_id": "c-2", "last_seq": 0, "last_message_at": None},
    ]
    second = await (
        await api.get(f"/v2/conversations?limit=2&cursor={page['next_cursor']}", headers=auth("alice"))
    ).json()
    # The newest message not recalled: m2 of c-3 is recalled, so its time is m1's.
    assert second == {
        "conversations": [{"conversation_id": "c-3", "last_seq": 2, "last_message_at": SENT}],
        "next_cursor": None,
    }
    nobody = await (await api.get("/v2/conversations", headers=auth("carol"))).json()
    assert nobody == {"conversations": [], "next_cursor": None}


async def test_a_search_keeps_the_ids_that_hold_it_whatever_their_case(api: Client, auth: Auth) -> None:
    for cid in ("Team-Alpha", "team-beta", "alpha_1", "alphax1", "other"):
        await make_conversation(api, auth, cid, ["alice"])
    await make_conversation(api, auth, "alpha-bob", ["bob"])

    async def ids(query: str) -> list[str]:
        response = await api.get(f"/v2/conversations?{query}", headers=auth("alice"))
        assert response.status == 200, await response.text()
        return [item["conversation_id"] for item in (await response.json())["conversations"]]

    assert await ids("q=ALPHA") == ["Team-Alpha", "alpha_1", "alphax1"]  # not bob's
    assert await ids("q=team") == ["Team-Alpha", "team-beta"]
    # LIKE's wildcards match themselves.
    assert await ids("q=a_1") == ["alpha_1"]
    assert await ids("q=%25") == []
    assert await ids("q=nothing") == []
    # Paged as without it.
    first = await (await api.get("/v2/conversations?q=alpha&limit=2", headers=auth("alice"))).json()
    assert [item["conversation_id"] for item in first["conversations"]] == ["Team-Alpha", "alpha_1"]
    assert await ids(f"q=alpha&limit=2&cursor={first['next_cursor']}") == ["alphax1"]


@pytest.mark.parametrize("query", ["q=", "q=" + "x" * 101, "q=a%00b", "q=a&q=b"])
async def test_a_bad_search_is_422(api: Client, auth: Auth, query: str) -> None:
    await expect_problem(await api.get(f"/v2/conversations?{query}", headers=auth("alice")), 422, "VALIDATION_FAILED")


@pytest.mark.parametrize("query", ["cursor=%25%25", "cursor=AAAA", "limit=0", "limit=101", "x=1"])
async def test_bad_queries_are_422(api: Client, auth: Auth, query: str) -> None:
    await expect_problem(await api.get(f"/v2/conversations?{query}", headers=auth("alice")), 422, "VALIDATION_FAILED")
