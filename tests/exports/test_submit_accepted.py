"""Accepted submissions of ``POST /v3/conversations/{cid}/exports`` (docs/api.md: Submitting an export, Submit;
docs/api.md: Tokens and keys, Idempotency-Key):
what a 202 promises, idempotent replays, key reuse and expiry, and the active-export quota. No pipeline runs here, so
every operation stays QUEUED unless the test moves it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest

from services.janitor.janitor import Janitor
from shared.settings import Settings
from tests.support.api_calls import expect_problem, make_conversation, submit
from tests.support.exports import Auth, Client, operation_state, post_export, stored

pytestmark = pytest.mark.module_database

VALID = {"format": "jsonl"}


def counts(operations: int) -> dict[str, int]:
    """What ``operations`` accepted submissions leave: one operation, key and outbox row each."""
    return {"operations": operations, "idempotency_keys": operations, "outbox": operations}


@pytest.fixture
async def members(api: Client, auth: Auth) -> None:
    """``c-a`` and ``c-b`` with alice and bob."""
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    await make_conversation(api, auth, "c-b", ["alice", "bob"])


async def test_202_comes_after_operation_key_and_outbox_row_are_committed(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    response = await submit(api, auth, "alice", "c-a", {"format": "jsonl", "before_seq": 9, "after_seq": 2}, "k-1")
    assert response.status == 202, await response.text()
    # Read at once, on other connections: the rows are visible, so they were committed before the answer.
    async with pool.acquire() as conn:
        operation = await conn.fetchrow("SELECT * FROM operations")
        key = await conn.fetchrow("SELECT * FROM idempotency_keys")
        outbox = await conn.fetchrow("SELECT * FROM outbox")
    body = await response.json()
    operation_id = body["operation_id"]
    assert response.headers["Location"] == f"/v3/operations/{operation_id}"
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["Retry-After"] == "1"
    assert response.content_type == "application/json"
    assert "Idempotent-Replayed" not in response.headers
    assert body["state"] == "QUEUED"

    assert operation is not None and key is not None and outbox is not None
    assert (operation["operation_id"], operation["state"]) == (operation_id, "QUEUED")
    assert (operation["owner_id"], operation["conversation_id"]) == ("alice", "c-a")
    assert (operation["format"], operation["before_seq"], operation["after_seq"]) == ("jsonl", 9, 2)
    assert (key["owner_id"], key["idempotency_key"], key["operation_id"]) == ("alice", "k-1", operation_id)
    assert key["fingerprint"]
    assert outbox["operation_id"] == operation_id
    assert json.loads(outbox["payload"]) == {"operation_id": operation_id}
    assert outbox["published_at"] is None
    assert await stored(pool) == counts(1)


async def test_replay_returns_the_current_representation_for_every_form_of_the_same_request(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    first = await submit(api, auth, "alice", "c-a", VALID, "k-1")
    assert first.status == 202
    location = first.headers["Location"]
    # The operation moves on; a replay must show where it is now, not the first answer.
    cancel = await api.post(f"{location}/cancel", headers=auth("alice"))
    assert cancel.status == 202, await cancel.text()
    # The cancel's own wake-up is the one more outbox row (docs/states.md: States and failure model, Cancel).
    assert await stored(pool) == {**counts(1), "outbox": 2}

    same_requests: list[Any] = [
        VALID,
        {"format": "jsonl", "after_seq": 0},
        {"after_seq": 0, "before_seq": None, "format": "jsonl"},
        b'{ "format" : "jsonl" }',
    ]
    for body in same_requests:
        replay = await post_export(api, auth("alice"), "c-a", body, key="k-1")
        assert replay.status == 202, (body, await replay.text())
        assert replay.headers["Location"] == location, body
        assert replay.headers.get("Idempotent-Replayed") == "true", body
        assert replay.headers["Cache-Control"] == "no-store", body
        assert replay.headers["Retry-After"] == "1", body
        current = await (await api.get(location, headers=auth("alice"))).json()
        assert await replay.json() == current, body
        assert current["state"] == "CANCEL_REQUESTED"
    assert await stored(pool) == {**counts(1), "outbox": 2}


async def test_same_key_with_another_request_is_409_reused_and_creates_nothing(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    first = await submit(api, auth, "alice", "c-a", {"format": "jsonl", "before_seq": 5}, "k-1")
    assert first.status == 202
    original = await first.json()

    others: list[tuple[str, dict[str, Any]]] = [
        ("c-a", {"format": "jsonl", "before_seq": 6}),
        ("c-a", {"format": "jsonl"}),
        ("c-a", {"format": "jsonl", "before_seq": 5, "after_seq": 1}),
        ("c-b", {"format": "jsonl", "before_seq": 5}),
    ]
    for cid, body in others:
        response = await submit(api, auth, "alice", cid, body, "k-1")
        await expect_problem(response, 409, "IDEMPOTENCY_KEY_REUSED", case=(cid, body))
        assert "Location" not in response.headers
    assert await stored(pool) == counts(1)

    # The key still belongs to the first request, unchanged.
    again = await submit(api, auth, "alice", "c-a", {"format": "jsonl", "before_seq": 5}, "k-1")
    assert again.status == 202
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert await again.json() == original


async def test_keys_are_scoped_to_the_user(api: Client, auth: Auth, pool: asyncpg.Pool, members: None) -> None:
    alice = await submit(api, auth, "alice", "c-a", VALID, "shared-key")
    assert alice.status == 202
    bob = await submit(api, auth, "bob", "c-a", VALID, "shared-key")
    assert bob.status == 202, await bob.text()
    assert "Idempotent-Replayed" not in bob.headers
    assert bob.headers["Location"] != alice.headers["Location"]
    assert (await bob.json())["operation_id"] != (await alice.json())["operation_id"]
    # Bob's use of the key with another request is his own business: not a reuse of alice's.
    bob_other = await submit(api, auth, "bob", "c-b", VALID, "alice-only")
    assert bob_other.status == 202
    alice_same = await submit(api, auth, "alice", "c-b", {"format": "jsonl", "before_seq": 3}, "alice-only")
    assert alice_same.status == 202, await alice_same.text()
    assert "Idempotent-Replayed" not in alice_same.headers
    assert await stored(pool) == counts(4)
    # Alice cannot see bob's operation through the shared key.
    peek = await api.get(bob.headers["Location"], headers=auth("alice"))
    await expect_problem(peek, 404, "NOT_FOUND")


async def test_concurrent_identical_submissions_create_one_operation(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    responses = await asyncio.gather(*(submit(api, auth, "alice", "c-a", VALID, "same") for _ in range(20)))
    statuses = [response.status for response in responses]
    assert statuses == [202] * 20, [(r.status, await r.text()) for r in responses if r.status != 202]
    assert len({response.headers["Location"] for response in responses}) == 1
    fresh = [response for response in responses if response.headers.get("Idempotent-Replayed") != "true"]
    assert len(fresh) == 1
    assert await stored(pool) == counts(1)


async def test_concurrent_submissions_never_overrun_the_quota(
    api: Client, auth: Auth, pool: asyncpg.Pool, settings: Settings, members: None
) -> None:
    limit = settings.max_active_exports
    responses = await asyncio.gather(
        *(submit(api, auth, "alice", "c-a", VALID, f"k-{number}") for number in range(limit * 2))
    )
    statuses = sorted(response.status for response in responses)
    assert statuses == [202] * limit + [429] * limit
    assert await stored(pool) == counts(limit)


async def test_key_past_its_replay_window_is_409_expired_until_the_record_is_purged(
    api: Client, auth: Auth, pool: asyncpg.Pool, settings: Settings, s3: Any, members: None
) -> None:
    first = await submit(api, auth, "alice", "c-a", VALID, "old-key")
    assert first.status == 202
    operation_id = (await first.json())["operation_id"]
    window = settings.idempotency_replay_window_seconds

    async def age_key(seconds: float) -> None:
        async with pool.acquire() as conn:
            await conn.execute(
                "UPDATE idempotency_keys SET created_at = now() - make_interval(secs => $1)", float(seconds)
            )

    await age_key(window - 60)
    inside = await submit(api, auth, "alice", "c-a", VALID, "old-key")
    assert inside.status == 202
    assert inside.headers.get("Idempotent-Replayed") == "true"

    await age_key(window + 1)
    expired = await submit(api, auth, "alice", "c-a", VALID, "old-key")
    body = await expect_problem(expired, 409, "IDEMPOTENCY_KEY_EXPIRED")
    assert "new key" in body["detail"].lower()
    assert await stored(pool) == counts(1)

    # Only when the operation record is purged may the key start a new export.
    assert (await api.post(f"/v3/operations/{operation_id}/cancel", headers=auth("alice"))).status == 202
    janitor = Janitor(pool=pool, s3=s3, settings=settings)
    assert await janitor.finish_abandoned_cancellations() == 1
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE operations SET created_at = now() - make_interval(secs => $1)",
            float(settings.operation_retention_seconds + 60),
        )
    await janitor.run_pass()
    assert await operation_state(pool, operation_id) is None
    reborn = await submit(api, auth, "alice", "c-a", VALID, "old-key")
    assert reborn.status == 202, await reborn.text()
    assert "Idempotent-Replayed" not in reborn.headers
    assert (await reborn.json())["operation_id"] != operation_id


async def test_quota_of_active_exports_is_429_and_counts_only_unfinished_ones(
    api: Client, auth: Auth, pool: asyncpg.Pool, settings: Settings, s3: Any, members: None
) -> None:
    limit = settings.max_active_exports
    locations = []
    for number in range(limit):
        response = await submit(api, auth, "alice", "c-a", VALID, f"k-{number}")
        assert response.status == 202, await response.text()
        locations.append(response.headers["Location"])

    over = await submit(api, auth, "alice", "c-a", VALID, "one-too-many")
    await expect_problem(over, 429, "TOO_MANY_ACTIVE_EXPORTS")
    assert over.headers["Retry-After"].isdigit() and int(over.headers["Retry-After"]) >= 1
    assert await stored(pool) == counts(limit)

    # Idempotency is checked before the quota: a replay still answers, a reuse is still a 409.
    replay = await submit(api, auth, "alice", "c-a", VALID, "k-0")
    assert replay.status == 202
    assert replay.headers.get("Idempotent-Replayed") == "true"
    reuse = await submit(api, auth, "alice", "c-b", VALID, "k-0")
    await expect_problem(reuse, 409, "IDEMPOTENCY_KEY_REUSED")
    # The quota is per user.
    bob = await submit(api, auth, "bob", "c-a", VALID, "k-0")
    assert bob.status == 202, await bob.text()

    # CANCEL_REQUESTED is not terminal: still counted.
    assert (await api.post(f"{locations[0]}/cancel", headers=auth("alice"))).status == 202
    await expect_problem(await submit(api, auth, "alice", "c-a", VALID, "one-too-many"), 429, "TOO_MANY_ACTIVE_EXPORTS")
    # CANCELED is terminal: the slot is free again.
    assert await Janitor(pool=pool, s3=s3, settings=settings).finish_abandoned_cancellations() == 1
    freed = await submit(api, auth, "alice", "c-a", VALID, "one-too-many")
    assert freed.status == 202, await freed.text()
    # Plus the cancel's wake-up.
    assert await stored(pool) == {**counts(limit + 2), "outbox": limit + 3}
