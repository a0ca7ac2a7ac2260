"""Exports that the real relay, worker and janitor run (docs/api.md: Downloads, Download; docs/api.md: Submitting an
export, The file; docs/states.md: States and failure model; docs/retention.md: Retention periods): the download with its
headers and ranges, refusals after revocation and expiry, cancellation finished by the janitor, the worker's own
membership check, and what the file holds.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import asyncpg
import pytest

from services.janitor.janitor import Janitor
from shared.settings import Settings
from tests.support import wait_for
from tests.support.api_calls import (
    expect_problem,
    expected_file,
    import_lines,
    make_conversation,
    read_all,
    running_pipeline,
    submit,
    wait_terminal,
)
from tests.support.bucket import objects_under
from tests.support.exports import (
    GUESSED_ID,
    NDJSON,
    TIMESTAMP,
    Auth,
    Client,
    download_events,
    operation_state,
)

pytestmark = pytest.mark.module_database

VALID = {"format": "jsonl"}


def lines(cid: str, count: int, *, first: int = 1, senders: tuple[str, ...] = ("alice", "bob")) -> list[dict[str, Any]]:
    bodies = ["hello", "你好", 'quote " and \\ backslash', "emoji 😀", "line\nbreak", "\u2028"]
    return [
        {"message_id": f"{cid}-m{n}", "sender_id": senders[n % len(senders)], "body": bodies[n % len(bodies)]}
        for n in range(first, first + count)
    ]


async def export(api: Client, auth: Auth, user: str, cid: str, key: str, body: Any = None) -> dict[str, Any]:
    """Submit and wait for the end; return the final representation."""
    response = await submit(api, auth, user, cid, body or VALID, key)
    assert response.status == 202, await response.text()
    return await wait_terminal(api, auth, user, response.headers["Location"])


async def submitted_alone(api: Client, auth: Auth, cid: str) -> tuple[list[dict[str, Any]], Any]:
    """``cid`` with alice alone and 3 messages of hers, and her export of it submitted with key ``k-1``:
    (the messages as the read API shows them, the 202 response).
    """
    await make_conversation(api, auth, cid, ["alice"])
    await import_lines(api, auth, cid, lines(cid, 3, senders=("alice",)))
    messages = await read_all(api, auth, "alice", cid)
    response = await submit(api, auth, "alice", cid, VALID, "k-1")
    assert response.status == 202
    return messages, response


async def test_download_serves_the_file_with_its_headers_and_ranges(
    api: Client, auth: Auth, pool: asyncpg.Pool, pipeline: None
) -> None:
    await make_conversation(api, auth, "c-d", ["alice", "bob"])
    await import_lines(api, auth, "c-d", lines("c-d", 12))
    operation = await export(api, auth, "alice", "c-d", "k-1")
    assert operation["state"] == "SUCCEEDED", operation
    operation_id = operation["operation_id"]
    expected = expected_file(await read_all(api, auth, "alice", "c-d"))
    size, sha256 = len(expected), hashlib.sha256(expected).hexdigest()

    result = operation["result"]
    assert result == {
        "url": f"/v3/exports/{operation_id}/result",
        "expires_at": result["expires_at"],
        "size_bytes": size,
        "sha256": sha256,
        "message_count": 12,
        "content_type": NDJSON,
        "next_after_seq": 12,
    }
    assert TIMESTAMP.match(result["expires_at"])
    assert operation["snapshot"] == {"max_seq": 12}
    assert operation["links"] == {"self": f"/v3/operations/{operation_id}", "result": result["url"]}
    assert "next_poll_after_seconds" not in operation
    final = await api.get(f"/v3/operations/{operation_id}", headers=auth("alice"))
    assert "Retry-After" not in final.headers

    full = await api.get(result["url"], headers=auth("alice"))
    assert full.status == 200
    content = await full.read()
    assert content == expected
    assert full.headers["Content-Type"] == NDJSON
    created = operation["created_at"][:10]
    assert full.headers["Content-Disposition"] == f'attachment; filename="c-d-{created}.jsonl"'
    assert full.headers["Repr-Digest"] == f"sha-256=:{base64.b64encode(hashlib.sha256(expected).digest()).decode()}:"
    assert full.headers["Content-Security-Policy"] == "sandbox"
    assert full.headers["X-Content-Type-Options"] == "nosniff"
    assert full.headers["Cache-Control"] == "no-store"
    assert full.headers["Content-Length"] == str(size)
    assert full.headers["ETag"] == f'"{sha256}"'

    ranges = {
        "bytes=0-9": (0, 9),
        "bytes=-5": (size - 5, size - 1),
        "bytes=10-": (10, size - 1),
        f"bytes=5-{size + 100}": (5, size - 1),
        f"bytes=-{size + 100}": (0, size - 1),
    }
    for header, (first, last) in ranges.items():
        partial = await api.get(result["url"], headers={**auth("alice"), "Range": header})
        assert partial.status == 206, (header, await partial.text())
        assert await partial.read() == expected[first : last + 1], header
        assert partial.headers["Content-Range"] == f"bytes {first}-{last}/{size}", header
        assert partial.headers["Content-Length"] == str(last - first + 1), header
        assert partial.headers["Content-Type"] == NDJSON, header
        assert partial.headers["ETag"] == f'"{sha256}"', header
        assert partial.headers["Repr-Digest"] == full.headers["Repr-Digest"], header
        assert partial.headers["Cache-Control"] == "no-store", header
    unsatisfiable = await api.get(result["url"], headers={**auth("alice"), "Range": f"bytes={size}-"})
    await expect_problem(unsatisfiable, 416, "RANGE_NOT_SATISFIABLE")
    assert unsatisfiable.headers["Content-Range"] == f"bytes */{size}"

    reference = await expect_problem(
        await api.get(f"/v3/exports/{GUESSED_ID}/result", headers=auth("alice")), 404, "NOT_FOUND"
    )
    for user in ("bob", "carol"):  # a member who is not the owner, and a stranger
        refused = await api.get(result["url"], headers=auth(user))
        assert await expect_problem(refused, 404, "NOT_FOUND", case=user) == reference

    # A refused range is recorded as that refusal, not as a grant.
    assert await download_events(pool, operation_id) == [("alice", "GRANTED")] * (1 + len(ranges)) + [
        ("alice", "RANGE_NOT_SATISFIABLE"),
        ("bob", "NOT_FOUND"),
        ("carol", "NOT_FOUND"),
    ]


async def test_finished_export_is_replayed_as_is_and_cannot_be_canceled(
    api: Client, auth: Auth, pool: asyncpg.Pool, pipeline: None
) -> None:
    await make_conversation(api, auth, "c-s", ["alice", "bob"])
    await import_lines(api, auth, "c-s", lines("c-s", 3))
    operation = await export(api, auth, "alice", "c-s", "k-1")
    assert operation["state"] == "SUCCEEDED", operation
    location = f"/v3/operations/{operation['operation_id']}"

    cancel = await api.post(f"{location}/cancel", headers=auth("alice"))
    body = await expect_problem(cancel, 409, "ALREADY_TERMINAL")
    assert body["state"] == "SUCCEEDED"
    assert await operation_state(pool, operation["operation_id"]) == "SUCCEEDED"
    assert await (await api.get(location, headers=auth("alice"))).json() == operation
    await expect_problem(await api.post(f"{location}/cancel", headers=auth("bob")), 404, "NOT_FOUND")

    replay = await submit(api, auth, "alice", "c-s", VALID, "k-1")
    assert replay.status == 202
    assert replay.headers["Location"] == location
    assert replay.headers.get("Idempotent-Replayed") == "true"
    assert await replay.json() == operation


async def test_download_after_revocation_is_403_and_after_expiry_is_410_with_the_object_gone(
    api: Client, auth: Auth, pool: asyncpg.Pool, settings: Settings, s3: Any, pipeline: None
) -> None:
    await make_conversation(api, auth, "c-e", ["alice", "bob"])
    await import_lines(api, auth, "c-e", lines("c-e", 3))
    operation = await export(api, auth, "alice", "c-e", "k-1")
    assert operation["state"] == "SUCCEEDED", operation
    operation_id, url = operation["operation_id"], operation["result"]["url"]
    admin = auth("root", admin=True)

    removed = await api.delete("/admin/conversations/c-e/members/alice", headers=admin)
    assert removed.status == 204
    await expect_problem(await api.get(url, headers=auth("alice")), 403, "ACCESS_REVOKED")
    # The owner still sees the operation; only the file is refused.
    assert (await (await api.get(f"/v3/operations/{operation_id}", headers=auth("alice"))).json())["state"] == (
        "SUCCEEDED"
    )
    assert (await api.put("/admin/conversations/c-e/members/alice", headers=admin)).status == 204
    granted = await api.get(url, headers=auth("alice"))
    assert granted.status == 200
    assert await granted.read() == expected_file(await read_all(api, auth, "alice", "c-e"))
    assert await objects_under(s3, settings, operation_id)

    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE operations SET result_expires_at = now() - interval '1 second' WHERE operation_id = $1",
            operation_id,
        )
    # One pass here; the running janitor may get there first, which is just as good.
    await Janitor(pool=pool, s3=s3, settings=settings).expire_results()

    async def expired_and_gone() -> bool:
        state = await operation_state(pool, operation_id)
        return state == "EXPIRED" and not await objects_under(s3, settings, operation_id)

    await wait_for(expired_and_gone, timeout=10)
    await expect_problem(await api.get(url, headers=auth("alice")), 410, "RESULT_EXPIRED")
    # Expiry is checked before membership.
    assert (await api.delete("/admin/conversations/c-e/members/alice", headers=admin)).status == 204
    await expect_problem(await api.get(url, headers=auth("alice")), 410, "RESULT_EXPIRED")

    expired = await api.get(f"/v3/operations/{operation_id}", headers=auth("alice"))
    body = await expired.json()
    assert (body["state"], body["result"]) == ("EXPIRED", None)
    assert "Retry-After" not in expired.headers
    assert await download_events(pool, operation_id) == [
        ("alice", "ACCESS_REVOKED"),
        ("alice", "GRANTED"),
        ("alice", "RESULT_EXPIRED"),
        ("alice", "RESULT_EXPIRED"),
    ]


async def test_cancel_requested_before_any_worker_ends_canceled_by_the_janitor(
    api: Client, auth: Auth, pool: asyncpg.Pool, settings: Settings, s3: Any
) -> None:
    messages, response = await submitted_alone(api, auth, "c-f")
    location = response.headers["Location"]
    operation_id = (await response.json())["operation_id"]
    cancel = await api.post(f"{location}/cancel", headers=auth("alice"))
    assert cancel.status == 202
    assert cancel.headers["Location"] == location
    assert (await cancel.json())["state"] == "CANCEL_REQUESTED"

    async with running_pipeline(settings):
        operation = await wait_terminal(api, auth, "alice", location)
        assert operation["state"] == "CANCELED", operation
        assert (operation["result"], operation["error"]) == (None, None)

        again = await api.post(f"{location}/cancel", headers=auth("alice"))
        assert again.status == 200, await again.text()
        assert "Retry-After" not in again.headers
        assert await again.json() == operation
        body = await expect_problem(
            await api.get(f"/v3/exports/{operation_id}/result", headers=auth("alice")), 409, "RESULT_NOT_AVAILABLE"
        )
        assert body["state"] == "CANCELED"
    assert await objects_under(s3, settings, operation_id) == []
    assert await read_all(api, auth, "alice", "c-f") == messages


async def test_worker_fails_the_export_of_an_owner_who_lost_access_before_it_ran(
    api: Client, auth: Auth, pool: asyncpg.Pool, settings: Settings, s3: Any
) -> None:
    await make_conversation(api, auth, "c-g", ["alice", "bob"])
    await import_lines(api, auth, "c-g", lines("c-g", 4))
    response = await submit(api, auth, "alice", "c-g", VALID, "k-1")
    assert response.status == 202
    location = response.headers["Location"]
    operation_id = (await response.json())["operation_id"]
    removed = await api.delete("/admin/conversations/c-g/members/alice", headers=auth("root", admin=True))
    assert removed.status == 204

    async with running_pipeline(settings):
        operation = await wait_terminal(api, auth, "alice", location)
    assert operation["state"] == "FAILED", operation
    assert operation["error"]["code"] == "ACCESS_REVOKED"
    assert operation["error"]["message"]
    assert operation["result"] is None
    assert await objects_under(s3, settings, operation_id) == []
    await expect_problem(
        await api.get(f"/v3/exports/{operation_id}/result", headers=auth("alice")), 409, "RESULT_NOT_AVAILABLE"
    )


async def test_recalled_messages_and_messages_after_the_snapshot_are_not_exported(
    api: Client, auth: Auth, pipeline: None
) -> None:
    await make_conversation(api, auth, "c-h", ["alice", "bob"])
    await import_lines(api, auth, "c-h", lines("c-h", 6))
    for sender, message_id in (("bob", "c-h-m1"), ("alice", "c-h-m4")):
        recalled = await api.delete(f"/v2/conversations/c-h/messages/{message_id}", headers=auth(sender))
        assert recalled.status == 200, await recalled.text()
    visible = await read_all(api, auth, "alice", "c-h")
    assert [message["seq"] for message in visible] == [2, 3, 5, 6]

    operation = await export(api, auth, "alice", "c-h", "k-1")
    assert operation["state"] == "SUCCEEDED", operation
    assert operation["snapshot"] == {"max_seq": 6}
    assert operation["result"]["message_count"] == 4
    content = await (await api.get(operation["result"]["url"], headers=auth("alice"))).read()
    assert content == expected_file(visible)

    # Messages stored after the snapshot belong to later exports only.
    await import_lines(api, auth, "c-h", lines("c-h", 2, first=7))
    sent = await api.post(
        "/v2/conversations/c-h/messages", json={"message_id": "c-h-late", "body": "late"}, headers=auth("bob")
    )
    assert sent.status == 200, await sent.text()
    again = await (await api.get(operation["result"]["url"], headers=auth("alice"))).read()
    assert again == content
    current = await (await api.get(f"/v3/operations/{operation['operation_id']}", headers=auth("alice"))).json()
    assert current["snapshot"] == {"max_seq": 6}

    later = await export(api, auth, "alice", "c-h", "k-2")
    assert later["snapshot"] == {"max_seq": 9}
    later_content = await (await api.get(later["result"]["url"], headers=auth("alice"))).read()
    assert later_content == expected_file(await read_all(api, auth, "alice", "c-h"))
    assert later_content.startswith(content) and len(later_content) > len(content)


async def test_a_retry_exports_up_to_the_snapshot_its_first_attempt_fixed(
    api: Client, auth: Auth, pool: asyncpg.Pool, settings: Settings, s3: Any
) -> None:
    first_three, response = await submitted_alone(api, auth, "c-r")
    operation_id = (await response.json())["operation_id"]
    # What a first attempt leaves when it claimed the operation at max_seq 3 and then hit a transient fault.
    async with pool.acquire() as conn:
        await conn.execute(
            """
            UPDATE operations SET state = 'RETRY_AT', attempt = 1, generation = 1, snapshot_max_seq = 3,
                retry_at = now(), error_code = 'STORAGE_UNAVAILABLE', error_message = 'retried'
            WHERE operation_id = $1
            """,
            operation_id,
        )
    await import_lines(api, auth, "c-r", lines("c-r", 2, first=4, senders=("alice",)))

    async with running_pipeline(settings):
        operation = await wait_terminal(api, auth, "alice", response.headers["Location"])
        assert operation["state"] == "SUCCEEDED", operation
        content = await (await api.get(operation["result"]["url"], headers=auth("alice"))).read()
    assert operation["snapshot"] == {"max_seq": 3}
    assert operation["attempt"] == 2
    assert operation["error"] is None
    assert content == expected_file(first_three)


async def test_every_line_of_the_file_is_one_line_for_every_reader(api: Client, auth: Auth, pipeline: None) -> None:
    breaking = ["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\r", "\r\n", "\n"]
    bodies = [f"a{char}b" for char in breaking] + ["".join(breaking), "\u2028\u2029 plain \u00e9\u4f60"]
    await make_conversation(api, auth, "c-lines", ["alice"])
    await import_lines(
        api,
        auth,
        "c-lines",
        [{"message_id": f"m\u2028{n}", "sender_id": "alice", "body": body} for n, body in enumerate(bodies)],
    )
    page = await api.get("/v2/conversations/c-lines/messages", headers=auth("alice"))
    raw_page = await page.text()
    assert not any(char in raw_page for char in ("\u2028", "\u2029", "\u0085"))
    messages = (await page.json())["messages"]
    assert [message["body"] for message in messages] == bodies

    operation = await export(api, auth, "alice", "c-lines", "k-1")
    assert operation["state"] == "SUCCEEDED", operation
    content = await (await api.get(operation["result"]["url"], headers=auth("alice"))).read()
    assert content == expected_file(messages)
    text = content.decode()
    assert len(text.splitlines()) == operation["result"]["message_count"] == len(bodies)
    assert [json.loads(line)["body"] for line in text.splitlines()] == bodies
    assert [json.loads(line)["message_id"] for line in text.splitlines()] == [m["message_id"] for m in messages]


@pytest.mark.parametrize(
    ("request_body", "max_seq", "seqs"),
    [
        ({"before_seq": 9}, 8, list(range(1, 9))),
        ({"after_seq": 3, "before_seq": 6}, 5, [4, 5]),
        ({"after_seq": 10}, 10, []),
        ({"after_seq": 12}, 12, []),
        ({"before_seq": 40}, 10, list(range(1, 11))),
    ],
)
async def test_the_snapshot_watermark_is_the_highest_seq_the_file_may_hold(
    api: Client, auth: Auth, pipeline: None, request_body: dict[str, int], max_seq: int, seqs: list[int]
) -> None:
    await make_conversation(api, auth, "c-w", ["alice"])
    await import_lines(api, auth, "c-w", lines("c-w", 10, senders=("alice",)))
    operation = await export(api, auth, "alice", "c-w", "k-1", {"format": "jsonl", **request_body})
    assert operation["state"] == "SUCCEEDED", operation
    assert operation["snapshot"] == {"max_seq": max_seq}
    content = await (await api.get(operation["result"]["url"], headers=auth("alice"))).read()
    assert [json.loads(line)["seq"] for line in content.decode().splitlines()] == seqs
