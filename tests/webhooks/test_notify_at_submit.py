"""The callback URL at submit (docs/api.md: Completion callbacks): a URL that may not receive
callbacks is a 422 that quotes nothing of it and stores nothing, and ``notify`` is part of the request's
fingerprint only when present.
"""

from __future__ import annotations

import asyncpg
import pytest

from tests.support.api_calls import expect_problem, make_conversation
from tests.support.exports import Auth, Client, post_export, stored

pytestmark = pytest.mark.module_database

NOTHING = dict.fromkeys(("operations", "idempotency_keys", "outbox"), 0)


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/hook?token=topsecret",
        "https://127.0.0.1/hook?token=topsecret",
        "https://2130706433/hook?token=topsecret",
        "https://[::ffff:10.0.0.1]/hook?token=topsecret",
        "https://169.254.169.254/latest?token=topsecret",
        "https://user:topsecret@example.com/hook",
        "https://localhost/hook?token=topsecret",
        # Internal addresses in other spellings: a trailing dot, IDNA's full stops, NAT64, 6to4, Teredo.
        "https://169.254.169.254./latest?token=topsecret",
        "https://127.0.0.1./hook?token=topsecret",
        "https://127。0。0。1/hook?token=topsecret",
        "https://localhost。/hook?token=topsecret",
        "https://[64:ff9b::7f00:1]/hook?token=topsecret",
        "https://[64:ff9b::a9fe:a9fe]/latest?token=topsecret",
        "https://[2002:7f00:1::]/hook?token=topsecret",
        "https://[2001:0:808:808::80ff:fffe]/hook?token=topsecret",
    ],
)
async def test_a_url_that_may_not_receive_callbacks_is_refused(
    api: Client, auth: Auth, pool: asyncpg.Pool, url: str
) -> None:
    await make_conversation(api, auth, "c-a", ["alice"])
    response = await post_export(api, auth("alice"), "c-a", {"format": "jsonl", "notify": {"url": url}})
    problem = await expect_problem(response, 422, "NOTIFY_URL_REFUSED")
    assert problem["errors"][0]["loc"] == ["body", "notify", "url"]
    assert "topsecret" not in await response.text()
    assert await stored(pool) == NOTHING


async def test_notify_is_part_of_the_fingerprint_only_when_present(api: Client, auth: Auth) -> None:
    await make_conversation(api, auth, "c-a", ["alice"])
    plain = {"format": "jsonl"}
    notified = {"format": "jsonl", "notify": {"url": "https://example.com/hook"}}
    assert (await post_export(api, auth("alice"), "c-a", plain, key="k-plain")).status == 202
    assert (await post_export(api, auth("alice"), "c-a", plain, key="k-plain")).status == 202
    reused = await post_export(api, auth("alice"), "c-a", notified, key="k-plain")
    await expect_problem(reused, 409, "IDEMPOTENCY_KEY_REUSED")
    assert (await post_export(api, auth("alice"), "c-a", notified, key="k-notified")).status == 202
    replay = await post_export(api, auth("alice"), "c-a", notified, key="k-notified")
    assert replay.status == 202 and replay.headers["Idempotent-Replayed"] == "true"
