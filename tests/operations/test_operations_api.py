"""The status monitor and cancel without a pipeline (docs/api.md: Operations, Operation; docs/api.md: Operations,
List; docs/api.md: Operations, Cancel; docs/states.md: States and failure model): the representation, who may see it,
the list, and cancel from the states an operation can be in. State changes that only a worker or the janitor makes are
written into Postgres directly, as they would have left them.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

import asyncpg
import pytest

from services.api.http.bodies import EMPTY_BODY_MAX_BYTES
from services.janitor.janitor import Janitor
from shared.repository import status_monitor
from shared.settings import Settings
from tests.support import documented
from tests.support.api_calls import expect_problem, import_lines, make_conversation, read_all, submit
from tests.support.exports import (
    GUESSED_ID,
    REPRESENTATION_KEYS,
    TIMESTAMP,
    Auth,
    Client,
    download_events,
    operation_state,
)

pytestmark = pytest.mark.module_database

VALID = {"format": "jsonl"}
URL_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


# What a poll's answer carries besides its body (docs/api.md: Operations, Operation).
ANSWER_HEADERS = ("Content-Type", "Cache-Control", "ETag", "Retry-After")


@pytest.fixture
def monitor_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the operations the status monitor reads whole (``status_monitor.read_operation``)."""
    reads: list[str] = []
    read_operation = status_monitor.read_operation

    async def counted(conn: asyncpg.Connection, *, operation_id: str, owner_id: str | None) -> Any:
        reads.append(operation_id)
        return await read_operation(conn, operation_id=operation_id, owner_id=owner_id)

    monkeypatch.setattr(status_monitor, "read_operation", counted)
    return reads


@pytest.fixture
async def members(api: Client, auth: Auth) -> None:
    """``c-a`` and ``c-b`` with alice and bob; carol is in neither."""
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    await make_conversation(api, auth, "c-b", ["alice", "bob"])


async def create(api: Client, auth: Auth, user: str, cid: str, key: str, body: Any = None) -> dict[str, Any]:
    response = await submit(api, auth, user, cid, body or VALID, key)
    assert response.status == 202, await response.text()
    created: dict[str, Any] = await response.json()
    return created


async def set_state(pool: asyncpg.Pool, operation_id: str, state: str) -> None:
    async with pool.acquire() as conn:
        await conn.execute("UPDATE operations SET state = $2 WHERE operation_id = $1", operation_id, state)


async def test_owner_sees_the_documented_representation(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    response = await submit(api, auth, "alice", "c-a", {"format": "jsonl", "before_seq": 9, "after_seq": 2}, "k-1")
    assert response.status == 202
    accepted = await response.json()
    location = response.headers["Location"]

    got = await api.get(location, headers=auth("alice"))
    assert got.status == 200
    assert got.content_type == "application/json"
    assert got.headers["Cache-Control"] == "no-store"
    body = await got.json()
    assert got.headers["Retry-After"] == str(body["next_poll_after_seconds"])
    assert body == accepted

    assert body.keys() == REPRESENTATION_KEYS | {"next_poll_after_seconds"}
    operation_id = body["operation_id"]
    assert location == f"/v3/operations/{operation_id}"
    assert 0 < len(operation_id) <= 64 and set(operation_id) <= URL_SAFE, operation_id
    assert body["kind"] == "conversation_export"
    assert body["state"] == "QUEUED"
    assert body["conversation_id"] == "c-a"
    assert body["request"] == {
        "format": "jsonl",
        "before_seq": 9,
        "after_seq": 2,
        "since": None,
        "until": None,
        "senders": None,
        "compression": "none",
        "max_part_bytes": None,
        "media": False,
        "media_types": None,
        "media_max_file_bytes": None,
        "media_max_total_bytes": None,
    }
    assert body["estimate"] == {"messages_at_most": 6, "bytes": None}
    assert TIMESTAMP.match(body["created_at"]), body["created_at"]
    assert TIMESTAMP.match(body["updated_at"]), body["updated_at"]
    async with pool.acquire() as conn:
        now = await conn.fetchval("SELECT now()")
    assert abs((now - datetime.fromisoformat(body["created_at"])).total_seconds()) < 60
    assert body["attempt"] == 0
    # Only measured values: a phase and counts, never a percentage or an ETA.
    assert body["progress"].keys() == {"phase", "messages_written", "bytes_written"}
    assert isinstance(body["progress"]["phase"], str)
    assert (body["progress"]["messages_written"], body["progress"]["bytes_written"]) == (0, 0)
    assert (body["snapshot"], body["retry_at"], body["error"], body["result"]) == (None, None, None, None)
    assert body["links"] == {"self": location, "cancel": f"{location}/cancel"}
    assert body["next_poll_after_seconds"] == 1

    plain = await create(api, auth, "alice", "c-a", "k-2")
    assert plain["request"] == {
        "format": "jsonl",
        "before_seq": None,
        "after_seq": 0,
        "since": None,
        "until": None,
        "senders": None,
        "compression": "none",
        "max_part_bytes": None,
        "media": False,
        "media_types": None,
        "media_max_file_bytes": None,
        "media_max_total_bytes": None,
    }
    assert plain["estimate"] == {"messages_at_most": None, "bytes": None}


async def test_operation_ids_are_opaque_and_random(api: Client, auth: Auth, settings: Settings, members: None) -> None:
    ids = [
        (await create(api, auth, "alice", "c-a", f"k-{n}"))["operation_id"] for n in range(settings.max_active_exports)
    ]
    assert len(set(ids)) == len(ids)
    # Whatever prefix they share, each keeps at least 96 bits: 16 base64url characters.
    shared = 0
    while len({operation_id[: shared + 1] for operation_id in ids}) == 1:
        shared += 1
    for operation_id in ids:
        assert len(operation_id) - shared >= 16, ids
    # Not sequential: no two ids differ only in their last character.
    assert len({operation_id[:-1] for operation_id in ids}) == len(ids), ids


async def test_poll_interval_grows_with_age_and_stops_at_the_end(
    api: Client, auth: Auth, pool: asyncpg.Pool, settings: Settings, s3: Any, members: None
) -> None:
    operation_id = (await create(api, auth, "alice", "c-a", "k-1"))["operation_id"]
    seen = []
    for age in (0, 95, 250, 3600):
        async with pool.acquire() as conn:
            await conn.execute("UPDATE operations SET created_at = now() - make_interval(secs => $1)", float(age))
        response = await api.get(f"/v3/operations/{operation_id}", headers=auth("alice"))
        body = await response.json()
        interval = body["next_poll_after_seconds"]
        assert response.headers["Retry-After"] == str(interval)
        assert 1 <= interval <= 30
        seen.append(interval)
    assert seen == sorted(seen) and seen[0] < seen[-1], seen
    assert seen[-1] == 30

    assert (await api.post(f"/v3/operations/{operation_id}/cancel", headers=auth("alice"))).status == 202
    await Janitor(pool=pool, s3=s3, settings=settings).finish_abandoned_cancellations()
    ended = await api.get(f"/v3/operations/{operation_id}", headers=auth("alice"))
    body = await ended.json()
    assert body["state"] == "CANCELED"
    assert "Retry-After" not in ended.headers
    assert "next_poll_after_seconds" not in body
    assert body["links"] == {"self": f"/v3/operations/{operation_id}"}
    assert ended.headers["Cache-Control"] == "no-store"


async def test_a_poll_of_a_version_already_rendered_reads_only_its_stamp(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None, monitor_reads: list[str]
) -> None:
    """docs/benchmark.md: The poll's own work. The submit's answer rendered the operation, so polls of that
    version answer alike from the rendering the process keeps; a new version is read whole, once.
    """
    operation_id = (await create(api, auth, "alice", "c-a", "k-1"))["operation_id"]
    url = f"/v3/operations/{operation_id}"
    monitor_reads.clear()

    async def answers() -> list[tuple[bytes, dict[str, str]]]:
        polled = []
        for _ in range(3):
            response = await api.get(url, headers=auth("alice"))
            assert response.status == 200
            polled.append((await response.read(), {name: response.headers[name] for name in ANSWER_HEADERS}))
        return polled

    first = await answers()
    assert first[1:] == first[:1] * 2
    assert monitor_reads == []

    await pool.execute("UPDATE operations SET messages_written = 7 WHERE operation_id = $1", operation_id)
    second = await answers()
    assert second[1:] == second[:1] * 2
    assert b'"messages_written": 7' in second[0][0] and second[0][1]["ETag"] != first[0][1]["ETag"]
    assert monitor_reads == [operation_id]


async def test_anyone_but_the_owner_gets_the_404_of_an_id_that_never_existed(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    operation_id = (await create(api, auth, "alice", "c-a", "k-1"))["operation_id"]
    requests = [
        ("GET", "/v3/operations/{}"),
        ("POST", "/v3/operations/{}/cancel"),
        ("GET", "/v3/exports/{}/result"),
    ]
    for method, template in requests:
        reference = await expect_problem(
            await api.request(method, template.format(GUESSED_ID), headers=auth("alice")), 404, "NOT_FOUND"
        )
        for user, target in [
            ("bob", operation_id),  # a member of the conversation, not the owner
            ("carol", operation_id),  # not even a member
            ("alice", operation_id[:-1] + ("B" if operation_id.endswith("A") else "A")),  # one character off
            ("alice", "o" * 65),
            ("alice", "%00"),
            ("alice", "op%20x"),
        ]:
            response = await api.request(method, template.format(target), headers=auth(user))
            body = await expect_problem(response, 404, "NOT_FOUND", case=(method, template, user, target))
            assert body == reference, (method, template, user, target)
    assert await operation_state(pool, operation_id) == "QUEUED"
    # Every download attempt was recorded, including those naming no possible operation.
    async with pool.acquire() as conn:
        outcomes = await conn.fetch("SELECT outcome FROM access_events WHERE action = 'download'")
    assert [row["outcome"] for row in outcomes] == ["NOT_FOUND"] * 7


async def test_list_is_newest_first_filtered_paginated_and_only_the_callers(
    api: Client, auth: Auth, members: None
) -> None:
    created = [await create(api, auth, "alice", cid, f"k-{n}") for n, cid in enumerate(["c-a", "c-b", "c-a", "c-b"])]
    await create(api, auth, "bob", "c-a", "k-0")
    newest_first = [operation["operation_id"] for operation in reversed(created)]
    cancel = await api.post(f"/v3/operations/{created[1]['operation_id']}/cancel", headers=auth("alice"))
    assert cancel.status == 202

    async def listing(**query: Any) -> dict[str, Any]:
        response = await api.get("/v3/operations", params=query, headers=auth("alice"))
        assert response.status == 200, await response.text()
        assert response.headers["Cache-Control"] == "no-store"
        body: dict[str, Any] = await response.json()
        assert body.keys() == {"operations", "next_cursor"}
        return body

    everything = await listing()
    assert [operation["operation_id"] for operation in everything["operations"]] == newest_first
    assert everything["next_cursor"] is None
    for operation in everything["operations"]:
        single = await (await api.get(f"/v3/operations/{operation['operation_id']}", headers=auth("alice"))).json()
        # The poll interval follows the operation's age, which moved on between the two requests.
        assert operation.pop("next_poll_after_seconds") >= 1
        assert single.pop("next_poll_after_seconds") >= 1
        assert operation == single

    queued = await listing(state="QUEUED")
    assert [o["operation_id"] for o in queued["operations"]] == [newest_first[0], newest_first[1], newest_first[3]]
    canceling = await listing(state="CANCEL_REQUESTED")
    assert [o["operation_id"] for o in canceling["operations"]] == [created[1]["operation_id"]]
    assert (await listing(state="SUCCEEDED"))["operations"] == []

    for limit in (1, 2, 3):
        pages: list[str] = []
        query: dict[str, Any] = {"limit": limit}
        while True:
            page = await listing(**query)
            assert 0 < len(page["operations"]) <= limit
            pages += [operation["operation_id"] for operation in page["operations"]]
            if page["next_cursor"] is None:
                break
            query = {"limit": limit, "cursor": page["next_cursor"]}
        assert pages == newest_first, limit

    first = await listing(state="QUEUED", limit=2)
    rest = await listing(state="QUEUED", limit=2, cursor=first["next_cursor"])
    assert [o["operation_id"] for o in first["operations"] + rest["operations"]] == [
        newest_first[0],
        newest_first[1],
        newest_first[3],
    ]
    assert rest["next_cursor"] is None

    bobs = await (await api.get("/v3/operations", headers=auth("bob"))).json()
    assert len(bobs["operations"]) == 1
    assert bobs["operations"][0]["operation_id"] not in newest_first
    assert (await (await api.get("/v3/operations", headers=auth("carol"))).json()) == {
        "operations": [],
        "next_cursor": None,
    }


def _cursor(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


async def test_list_rejects_a_bad_query_or_cursor_with_422(api: Client, auth: Auth, members: None) -> None:
    await create(api, auth, "alice", "c-a", "k-1")
    await create(api, auth, "alice", "c-a", "k-2")
    page = await (await api.get("/v3/operations", params={"limit": 1}, headers=auth("alice"))).json()
    real = page["next_cursor"]
    assert real

    bad_queries: list[tuple[dict[str, str], str]] = [
        ({"cursor": "not a cursor!"}, "cursor"),
        ({"cursor": real[: len(real) // 2]}, "cursor"),
        ({"cursor": _cursor(b"[]")}, "cursor"),
        ({"cursor": _cursor(b'{"a": 1}')}, "cursor"),
        ({"cursor": _cursor(b'["yesterday", "op_x"]')}, "cursor"),
        ({"cursor": _cursor(b'[null, "op_x"]')}, "cursor"),
        ({"cursor": _cursor(b'["2026-11-30T08:00:00+00:00", "op_\\u0000"]')}, "cursor"),
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "5.0"}, "limit"),
        ({"limit": "+5"}, "limit"),
        ({"limit": "1_0"}, "limit"),
        ({"state": "queued"}, "state"),
        ({"state": "DONE"}, "state"),
        ({"page": "2"}, "page"),
    ]
    for query, name in bad_queries:
        response = await api.get("/v3/operations", params=query, headers=auth("alice"))
        body = await expect_problem(response, 422, "VALIDATION_FAILED", case=query)
        assert ["query", name] in [error["loc"][:2] for error in body["errors"]], (query, body)
    # One error per bad parameter, at its own name: no internals of how it is validated.
    response = await api.get("/v3/operations", params={"state": "DONE"}, headers=auth("alice"))
    body = await expect_problem(response, 422, "VALIDATION_FAILED")
    assert [error["loc"] for error in body["errors"]] == [["query", "state"]]


async def test_cancel_of_a_queued_operation_is_202_and_idempotent(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    await import_lines(api, auth, "c-a", [{"message_id": f"m-{n}", "sender_id": "bob", "body": "x"} for n in range(3)])
    messages = await read_all(api, auth, "alice", "c-a")
    operation_id = (await create(api, auth, "alice", "c-a", "k-1"))["operation_id"]
    cancel_url = f"/v3/operations/{operation_id}/cancel"

    # A cancel body that breaks the rules cancels nothing.
    refused = await api.post(cancel_url, json={"reason": "x"}, headers=auth("alice"))
    await expect_problem(refused, 422, "VALIDATION_FAILED")
    refused = await api.post(cancel_url, data=b"{}", headers={**auth("alice"), "Content-Type": "text/plain"})
    await expect_problem(refused, 415, "UNSUPPORTED_MEDIA_TYPE")
    json_headers = {**auth("alice"), "Content-Type": "application/json"}
    padded = b"{}" + b" " * (EMPTY_BODY_MAX_BYTES - 1)
    await expect_problem(await api.post(cancel_url, data=padded, headers=json_headers), 413, "PAYLOAD_TOO_LARGE")
    refused = await api.post(cancel_url, params={"x": "1"}, headers=auth("alice"))
    problem = await expect_problem(refused, 422, "VALIDATION_FAILED")
    assert [error["loc"] for error in problem["errors"]] == [["query", "x"]]
    assert await operation_state(pool, operation_id) == "QUEUED"

    for attempt, body in enumerate([None, b"{}" + b" " * (EMPTY_BODY_MAX_BYTES - 2)]):
        headers = auth("alice") if body is None else {**auth("alice"), "Content-Type": "application/json"}
        response = await api.post(cancel_url, data=body, headers=headers)
        assert response.status == 202, (attempt, await response.text())
        assert response.headers["Location"] == f"/v3/operations/{operation_id}"
        assert response.headers["Cache-Control"] == "no-store"
        assert "Retry-After" in response.headers
        body = await response.json()
        assert body["state"] == "CANCEL_REQUESTED"
        assert body == await (await api.get(f"/v3/operations/{operation_id}", headers=auth("alice"))).json()
    assert await operation_state(pool, operation_id) == "CANCEL_REQUESTED"
    # A cancel never touches messages.
    assert await read_all(api, auth, "alice", "c-a") == messages


async def test_cancel_answers_by_state_as_documented(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    for number, state in enumerate(["FAILED", "FAILED_REPAIR", "EXPIRED"]):
        operation_id = (await create(api, auth, "alice", "c-a", f"k-{number}"))["operation_id"]
        await set_state(pool, operation_id, state)
        response = await api.post(f"/v3/operations/{operation_id}/cancel", headers=auth("alice"))
        body = await expect_problem(response, 409, "ALREADY_TERMINAL", case=state)
        assert body["state"] == state
        assert await operation_state(pool, operation_id) == state

    operation_id = (await create(api, auth, "alice", "c-a", "k-canceled"))["operation_id"]
    await set_state(pool, operation_id, "CANCELED")
    response = await api.post(f"/v3/operations/{operation_id}/cancel", headers=auth("alice"))
    assert response.status == 200, await response.text()
    body = await response.json()
    assert body["state"] == "CANCELED"
    assert "Retry-After" not in response.headers
    assert await operation_state(pool, operation_id) == "CANCELED"


async def test_download_of_an_unfinished_or_failed_export_is_409_and_every_attempt_is_recorded(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    operation_id = (await create(api, auth, "alice", "c-a", "k-1"))["operation_id"]
    url = f"/v3/exports/{operation_id}/result"

    body = await expect_problem(await api.get(url, headers=auth("alice")), 409, "RESULT_NOT_READY")
    assert body["state"] == "QUEUED"
    assert (await api.post(f"/v3/operations/{operation_id}/cancel", headers=auth("alice"))).status == 202
    body = await expect_problem(await api.get(url, headers=auth("alice")), 409, "RESULT_NOT_READY")
    assert body["state"] == "CANCEL_REQUESTED"
    for state in ("CANCELED", "FAILED", "FAILED_REPAIR"):
        await set_state(pool, operation_id, state)
        await expect_problem(await api.get(url, headers=auth("alice")), 409, "RESULT_NOT_AVAILABLE", case=state)
    await expect_problem(await api.get(url, headers=auth("bob")), 404, "NOT_FOUND")
    await expect_problem(await api.get(f"/v3/exports/{GUESSED_ID}/result", headers=auth("alice")), 404, "NOT_FOUND")

    assert await download_events(pool, operation_id) == [
        ("alice", "RESULT_NOT_READY"),
        ("alice", "RESULT_NOT_READY"),
        ("alice", "RESULT_NOT_AVAILABLE"),
        ("alice", "RESULT_NOT_AVAILABLE"),
        ("alice", "RESULT_NOT_AVAILABLE"),
        ("bob", "NOT_FOUND"),
    ]
    assert await download_events(pool, GUESSED_ID) == [("alice", "NOT_FOUND")]


async def test_a_wrong_method_is_405_with_allow(api: Client, auth: Auth, members: None) -> None:
    operation_id = (await create(api, auth, "alice", "c-a", "k-1"))["operation_id"]
    response = await api.delete(f"/v3/operations/{operation_id}", headers=auth("alice"))
    await expect_problem(response, 405, "METHOD_NOT_ALLOWED")
    assert "GET" in response.headers["Allow"]


def test_the_documented_cancel_body_limit_is_the_enforced_one() -> None:
    api_reference = documented("api.md")
    assert f"`{{}}` as `application/json` (at most {EMPTY_BODY_MAX_BYTES // 1024} KiB, else `413`)" in api_reference
