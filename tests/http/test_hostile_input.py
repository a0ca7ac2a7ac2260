"""Input crafted to reach corners of the parsers: each gets a clear 4xx problem and changes nothing."""

from __future__ import annotations

import base64
import json
from typing import Any

import asyncpg
import pytest

from tests.support.api_calls import Headers, expect_problem, make_conversation, read_all

pytestmark = pytest.mark.module_database  # every test starts from empty tables (tests/conftest.py)


async def test_deeply_nested_or_huge_number_json_is_malformed(api: Any, auth: Headers, pool: asyncpg.Pool) -> None:
    await make_conversation(api, auth, "c-h", ["alice"])
    json_headers = {"Content-Type": "application/json"}
    cases = [
        (
            "POST",
            "/v3/conversations/c-h/exports",
            b"[" * 1000,
            {**auth("alice"), **json_headers, "Idempotency-Key": "k"},
        ),
        ("POST", "/v2/conversations/c-h/messages", b"[" * 4000, {**auth("alice"), **json_headers}),
        (
            "PUT",
            "/admin/conversations/c-h",
            b'{"members":' + b"9" * 5000 + b"}",
            {**auth("root", admin=True), **json_headers},
        ),
    ]
    for method, path, body, headers in cases:
        await expect_problem(await api.request(method, path, data=body, headers=headers), 400, "MALFORMED_JSON")
    assert await pool.fetchval("SELECT count(*) FROM operations") == 0
    assert await pool.fetchval("SELECT count(*) FROM messages") == 0
    assert await pool.fetchval("SELECT count(*) FROM conversation_members WHERE conversation_id = 'c-h'") == 1


@pytest.mark.parametrize(
    "sent_at",
    [
        "0001-01-01T00:00:00Z",
        "0999-06-01T12:00:00+01:00",
        "0001-01-01T00:00:00+14:00",
        "9999-12-31T23:59:59-14:00",
        "2026-W01-1T00:00:00+00:00",
        "2026-01-01 00:00:00+00:00",
        "20260101T000000Z",
        "2026-01-01T00:00:00",
    ],
)
async def test_timestamps_outside_four_digit_years_are_refused(
    api: Any, auth: Headers, pool: asyncpg.Pool, sent_at: str
) -> None:
    await make_conversation(api, auth, "c-t", ["alice"])
    line = {"message_id": "m1", "sender_id": "alice", "body": "x", "sent_at": sent_at}
    response = await api.post(
        "/admin/conversations/c-t/messages:import",
        data=json.dumps(line).encode() + b"\n",
        headers={**auth("root", admin=True), "Content-Type": "application/x-ndjson"},
    )
    body = await expect_problem(response, 422, "VALIDATION_FAILED")
    assert body["errors"][0]["loc"] == ["body", 1, "sent_at"]
    assert await pool.fetchval("SELECT count(*) FROM messages") == 0


async def test_the_earliest_accepted_year_prints_alike_everywhere(api: Any, auth: Headers) -> None:
    await make_conversation(api, auth, "c-y", ["alice"])
    line = {"message_id": "m1", "sender_id": "alice", "body": "x", "sent_at": "1000-01-01T00:30:00.5-01:00"}
    response = await api.post(
        "/admin/conversations/c-y/messages:import",
        data=json.dumps(line).encode(),
        headers={**auth("root", admin=True), "Content-Type": "application/x-ndjson"},
    )
    assert response.status == 200
    assert [m["sent_at"] for m in await read_all(api, auth, "alice", "c-y")] == ["1000-01-01T01:30:00.500Z"]


def cursor(payload: Any) -> str:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "forged",
    [
        cursor(["0001-01-01T00:00:00+14:00", "op_x"]),
        cursor(["9999-12-31T23:59:59-14:00", "op_x"]),
        cursor(["2026-11-30T08:00:00", "op_x"]),
        cursor(b"[" * 4000),
        cursor(["2026-11-30T08:00:00+00:00", "op\u0000x"]),
    ],
)
async def test_forged_cursors_are_422(api: Any, auth: Headers, forged: str) -> None:
    response = await api.get("/v3/operations", params={"cursor": forged}, headers=auth("alice"))
    body = await expect_problem(response, 422, "VALIDATION_FAILED")
    assert body["errors"] == [{"loc": ["query", "cursor"], "msg": "Not a cursor from this API"}]


@pytest.mark.parametrize(
    ("path", "query", "name"),
    [
        ("/v2/conversations/c-h/messages", "limit=5&limit=0", "limit"),
        ("/v2/conversations/c-h/messages", "after_seq=0&after_seq=0", "after_seq"),
        ("/v3/operations", "limit=5&limit=0", "limit"),
        ("/v3/operations", "state=QUEUED&state=RUNNING", "state"),
        ("/admin/operations", "owner_id=alice&owner_id=bob", "owner_id"),
    ],
)
async def test_a_query_parameter_given_twice_is_422(api: Any, auth: Headers, path: str, query: str, name: str) -> None:
    """Which of two values counts would be a guess: the request is refused naming the parameter."""
    await make_conversation(api, auth, "c-h", ["alice"])
    headers = auth("root", admin=True) if path.startswith("/admin") else auth("alice")
    problem = await expect_problem(await api.get(f"{path}?{query}", headers=headers), 422, "VALIDATION_FAILED")
    assert [error["loc"] for error in problem["errors"]] == [["query", name]]
