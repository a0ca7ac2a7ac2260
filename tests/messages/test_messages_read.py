"""Reading a conversation (docs/api.md: Message store, Read): export lines in seq order, pages, and refused queries."""

from __future__ import annotations

import pytest

from tests.support.api_calls import expect_problem, import_lines
from tests.support.messages import Auth, Client, read, send

pytestmark = pytest.mark.module_database  # every test starts from empty tables (tests/conftest.py)

LINE_KEYS = ["conversation_id", "seq", "message_id", "sender_id", "sent_at", "body"]


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

    problem = await expect_problem(response, 422, "VALIDATION_FAILED")
    assert [error["loc"] for error in problem["errors"]] == [loc]
