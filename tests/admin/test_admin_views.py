"""The operator's views (docs/api.md: API reference): the list of every user's operations
(``GET /admin/operations``), the view of a conversation (``GET /admin/conversations/{cid}``), the
``CONVERSATION_NOT_FOUND`` answers of the admin conversation routes, and the import's line endings, on the
real Postgres through the real app.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from tests.support.api_calls import expect_problem, import_lines, make_conversation
from tests.support.exports import NDJSON, REPRESENTATION_KEYS, Auth, Client
from tests.support.rows import insert_operation

pytestmark = pytest.mark.module_database

# What the admin list adds to the owner's representation; the admin view of one operation adds its
# attempts, artifacts and access events on top.
ADMIN_LIST_KEYS = {"owner_id", "generation", "lease_owner", "lease_expires_at", "finished_at", "result_expires_at"}
HISTORY_KEYS = {"attempts", "artifacts", "access_events", "access_events_total", "webhook_deliveries", "chunks"}
# Long ago, so that every non-terminal operation polls at the 30 s cap whenever it is read.
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
# (operation_id, owner, conversation, state, minutes after EPOCH); op_b1 and op_b2 were created at the same
# instant, so the operation id orders them.
OPERATIONS = [
    ("op_a1", "alice", "c-a", "EXPIRED", 1),
    ("op_a2", "alice", "c-a", "FAILED_REPAIR", 2),
    ("op_b1", "bob", "c-a", "QUEUED", 3),
    ("op_b2", "bob", "c-b", "FAILED_REPAIR", 3),
    ("op_c1", "carol", "c-b", "RUNNING", 4),
    ("op_c2", "carol", "c-b", "FAILED_REPAIR", 5),
    ("op_a3", "alice", "c-b", "CANCELED", 6),
]
NEWEST_FIRST = ["op_a3", "op_c2", "op_c1", "op_b2", "op_b1", "op_a2", "op_a1"]


@pytest.fixture
async def operations(pool: asyncpg.Pool) -> None:
    """The operations of ``OPERATIONS``, as workers would have left them."""
    for operation_id, owner, conversation, state, minutes in OPERATIONS:
        parked = {"error_code": "WORKER_LOST", "error_message": "lost"} if state == "FAILED_REPAIR" else {}
        created = EPOCH + timedelta(minutes=minutes)
        await insert_operation(
            pool,
            operation_id,
            state,
            owner_id=owner,
            conversation_id=conversation,
            created_at=created,
            updated_at=created,
            **parked,
        )


async def admin_list(api: Client, auth: Auth, **query: Any) -> dict[str, Any]:
    response = await api.get("/admin/operations", params=query, headers=auth("root", admin=True))
    assert response.status == 200, await response.text()
    assert response.headers["Cache-Control"] == "no-store"
    body: dict[str, Any] = await response.json()
    assert body.keys() == {"operations", "next_cursor"}
    return body


def ids(page: dict[str, Any]) -> list[str]:
    return [operation["operation_id"] for operation in page["operations"]]


async def test_the_admin_list_shows_every_users_operations_newest_first(
    api: Client, auth: Auth, operations: None
) -> None:
    everything = await admin_list(api, auth)

    assert ids(everything) == NEWEST_FIRST
    assert everything["next_cursor"] is None
    admin = auth("root", admin=True)
    for item in everything["operations"]:
        assert item.keys() == REPRESENTATION_KEYS | ADMIN_LIST_KEYS | (
            set() if item["state"] in ("EXPIRED", "FAILED_REPAIR", "CANCELED") else {"next_poll_after_seconds"}
        )
        single = await (await api.get(f"/admin/operations/{item['operation_id']}", headers=admin)).json()
        # The single view is the same object with the operation's history added.
        assert {key: value for key, value in single.items() if key not in HISTORY_KEYS} == item
    parked = next(item for item in everything["operations"] if item["operation_id"] == "op_c2")
    assert (parked["owner_id"], parked["conversation_id"], parked["error"]) == (
        "carol",
        "c-b",
        {"code": "WORKER_LOST", "message": "lost"},
    )


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"state": "FAILED_REPAIR"}, ["op_c2", "op_b2", "op_a2"]),
        ({"state": "QUEUED"}, ["op_b1"]),
        ({"state": "SUCCEEDED"}, []),
        ({"conversation_id": "c-a"}, ["op_b1", "op_a2", "op_a1"]),
        ({"owner_id": "alice"}, ["op_a3", "op_a2", "op_a1"]),
        ({"owner_id": "nobody"}, []),
        ({"state": "FAILED_REPAIR", "conversation_id": "c-b"}, ["op_c2", "op_b2"]),
        ({"state": "FAILED_REPAIR", "conversation_id": "c-b", "owner_id": "bob"}, ["op_b2"]),
    ],
)
async def test_the_admin_list_filters_by_state_conversation_and_owner(
    api: Client, auth: Auth, operations: None, query: dict[str, str], expected: list[str]
) -> None:
    page = await admin_list(api, auth, **query)

    assert (ids(page), page["next_cursor"]) == (expected, None)


@pytest.mark.parametrize("limit", [1, 2, 3, 6])
async def test_the_admin_list_pages_with_its_cursor(api: Client, auth: Auth, operations: None, limit: int) -> None:
    seen: list[str] = []
    query: dict[str, Any] = {"limit": limit}
    while True:
        page = await admin_list(api, auth, **query)
        assert 0 < len(page["operations"]) <= limit
        seen += ids(page)
        if page["next_cursor"] is None:
            break
        query = {"limit": limit, "cursor": page["next_cursor"]}

    assert seen == NEWEST_FIRST


async def test_the_admin_list_keeps_its_filters_across_pages(api: Client, auth: Auth, operations: None) -> None:
    first = await admin_list(api, auth, state="FAILED_REPAIR", limit=2)
    rest = await admin_list(api, auth, state="FAILED_REPAIR", limit=2, cursor=first["next_cursor"])

    assert (ids(first), ids(rest), rest["next_cursor"]) == (["op_c2", "op_b2"], ["op_a2"], None)


async def test_the_admin_list_needs_the_admin_scope(api: Client, auth: Auth, operations: None) -> None:
    await expect_problem(await api.get("/admin/operations"), 401, "UNAUTHENTICATED")
    await expect_problem(await api.get("/admin/operations", headers=auth("alice")), 403, "FORBIDDEN")


async def test_the_admin_list_refuses_a_bad_query_with_422_naming_it(api: Client, auth: Auth, operations: None) -> None:
    real = (await admin_list(api, auth, limit=1))["next_cursor"]
    bad_queries: list[tuple[dict[str, str], str]] = [
        ({"state": "failed_repair"}, "state"),
        ({"state": ""}, "state"),
        ({"conversation_id": "c a"}, "conversation_id"),
        ({"conversation_id": ""}, "conversation_id"),
        ({"owner_id": "u" * 65}, "owner_id"),
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "+5"}, "limit"),
        ({"cursor": "not a cursor!"}, "cursor"),
        ({"cursor": real[: len(real) // 2]}, "cursor"),
        ({"owner": "alice"}, "owner"),
        ({"page": "2"}, "page"),
    ]
    for query, name in bad_queries:
        response = await api.get("/admin/operations", params=query, headers=auth("root", admin=True))
        body = await expect_problem(response, 422, "VALIDATION_FAILED", case=query)
        assert [error["loc"] for error in body["errors"]] == [["query", name]], (query, body)


# --- conversations ----------------------------------------------------------------------------------------


async def conversation_rows(pool: asyncpg.Pool, cid: str) -> tuple[int, int, int]:
    """(conversation rows, member rows, message rows) stored for ``cid``."""
    async with pool.acquire() as conn:
        return (
            await conn.fetchval("SELECT count(*) FROM conversations WHERE conversation_id = $1", cid),
            await conn.fetchval("SELECT count(*) FROM conversation_members WHERE conversation_id = $1", cid),
            await conn.fetchval("SELECT count(*) FROM messages WHERE conversation_id = $1", cid),
        )


async def test_the_conversation_view_counts_messages_not_recalled_and_sorts_members(api: Client, auth: Auth) -> None:
    # Upper case sorts before lower case by code point, whatever the database's collation says.
    await make_conversation(api, auth, "c-view", ["carol", "alice", "Zed", "bob", "alice"])
    await import_lines(
        api, auth, "c-view", [{"message_id": f"m-{n}", "sender_id": "alice", "body": "hi"} for n in range(4)]
    )
    assert (await api.delete("/v2/conversations/c-view/messages/m-1", headers=auth("alice"))).status == 200
    sent = await api.post(
        "/v2/conversations/c-view/messages", json={"message_id": "m-live", "body": "hey"}, headers=auth("bob")
    )
    assert sent.status == 200, await sent.text()

    response = await api.get("/admin/conversations/c-view", headers=auth("root", admin=True))

    assert response.status == 200, await response.text()
    assert response.headers["Cache-Control"] == "no-store"
    assert await response.json() == {
        "conversation_id": "c-view",
        "members": ["Zed", "alice", "bob", "carol"],
        "last_seq": 5,
        "message_count": 4,
    }


async def test_an_empty_conversation_has_no_members_and_no_messages(api: Client, auth: Auth) -> None:
    await make_conversation(api, auth, "c-empty", [])

    response = await api.get("/admin/conversations/c-empty", headers=auth("root", admin=True))

    assert await response.json() == {"conversation_id": "c-empty", "members": [], "last_seq": 0, "message_count": 0}


async def test_the_conversation_view_needs_the_admin_scope_and_a_well_formed_known_id(
    api: Client, auth: Auth, pool: asyncpg.Pool
) -> None:
    await make_conversation(api, auth, "c-a", ["alice"])
    admin = auth("root", admin=True)
    await expect_problem(await api.get("/admin/conversations/c-a", headers=auth("alice")), 403, "FORBIDDEN")
    for malformed in ("c%20a", "c" * 65, "c%00"):
        body = await expect_problem(
            await api.get(f"/admin/conversations/{malformed}", headers=admin), 422, "VALIDATION_FAILED", case=malformed
        )
        assert [error["loc"] for error in body["errors"]] == [["path", "cid"]], malformed

    missing = await expect_problem(
        await api.get("/admin/conversations/c-none", headers=admin), 404, "CONVERSATION_NOT_FOUND"
    )

    assert "PUT /admin/conversations/c-none" in missing["detail"]
    assert await conversation_rows(pool, "c-none") == (0, 0, 0)


@pytest.mark.parametrize("body", [b"", b'{"message_id": "m-1", "sender_id": "alice", "body": "hi"}\n'])
async def test_an_import_into_a_missing_conversation_stores_nothing(
    api: Client, auth: Auth, pool: asyncpg.Pool, body: bytes
) -> None:
    response = await api.post(
        "/admin/conversations/c-none/messages:import",
        data=body,
        headers={**auth("root", admin=True), "Content-Type": NDJSON},
    )

    problem = await expect_problem(response, 404, "CONVERSATION_NOT_FOUND")
    assert "create it with PUT /admin/conversations/c-none first" in problem["detail"]
    assert await conversation_rows(pool, "c-none") == (0, 0, 0)


async def test_member_changes_on_a_missing_conversation_are_conversation_not_found(
    api: Client, auth: Auth, pool: asyncpg.Pool
) -> None:
    admin = auth("root", admin=True)
    for method in (api.put, api.delete):
        problem = await expect_problem(
            await method("/admin/conversations/c-none/members/alice", headers=admin), 404, "CONVERSATION_NOT_FOUND"
        )
        assert "PUT /admin/conversations/c-none" in problem["detail"]
    assert await conversation_rows(pool, "c-none") == (0, 0, 0)


# --- the import's line endings ----------------------------------------------------------------------------

LINES = [json.dumps({"message_id": f"h-{n}", "sender_id": "alice", "body": f"line {n}"}).encode() for n in (1, 2, 3)]


@pytest.mark.parametrize(
    ("body", "imported"),
    [
        (b"\n".join(LINES) + b"\n", 3),
        (b"\r\n".join(LINES) + b"\r\n", 3),  # the \r is JSON whitespace at the end of the line
        (b"\n".join(LINES), 3),  # the last line needs no newline
        (b"\n".join(LINES) + b"\n\n\r\n \t\n", 3),  # blank lines at the end are ignored
        (LINES[0] + b"\n\r" + LINES[1], 2),  # \r is whitespace at the start of a line too
        (b"", 0),
        (b"\n\r\n\n", 0),  # only blank lines: nothing to import
    ],
    ids=["lf", "crlf", "no final newline", "blank lines at the end", "lf cr", "empty", "only blank lines"],
)
async def test_import_line_endings_that_are_accepted(
    api: Client, auth: Auth, pool: asyncpg.Pool, body: bytes, imported: int
) -> None:
    await make_conversation(api, auth, "c-lines", ["alice"])

    response = await api.post(
        "/admin/conversations/c-lines/messages:import",
        data=body,
        headers={**auth("root", admin=True), "Content-Type": NDJSON},
    )

    assert response.status == 200, await response.text()
    assert await response.json() == {"imported": imported, "skipped": 0}
    assert await conversation_rows(pool, "c-lines") == (1, 1, imported)


@pytest.mark.parametrize(
    ("body", "bad_line"),
    [
        (b"\r".join(LINES) + b"\r", 1),  # a lone \r ends no line: the body is one line of three objects
        (LINES[0] + b"\n\n" + LINES[1] + b"\n", 2),  # a blank line inside is a bad line
        (LINES[0] + b"\r\n\r\n" + LINES[1] + b"\r\n", 2),
        (LINES[0] + b"\n \n" + LINES[1] + b"\n", 2),
        (b"\n" + LINES[0] + b"\n", 1),  # so is a blank first line
        (b'{"message_id": "m", "sender_id": "alice", "body": "a\rb"}\n', 1),  # a raw \r inside a string
    ],
    ids=["lone cr", "blank line inside", "blank crlf line inside", "spaces inside", "blank first line", "raw cr"],
)
async def test_import_line_endings_that_refuse_the_batch(
    api: Client, auth: Auth, pool: asyncpg.Pool, body: bytes, bad_line: int
) -> None:
    await make_conversation(api, auth, "c-lines", ["alice"])

    response = await api.post(
        "/admin/conversations/c-lines/messages:import",
        data=body,
        headers={**auth("root", admin=True), "Content-Type": NDJSON},
    )

    problem = await expect_problem(response, 422, "VALIDATION_FAILED")
    assert f"Line {bad_line} " in problem["detail"]
    assert [error["loc"][:2] for error in problem["errors"]] == [["body", bad_line]]
    assert await conversation_rows(pool, "c-lines") == (1, 1, 0)
