"""Refused submissions of ``POST /v3/conversations/{cid}/exports`` (docs/api.md: Tokens and keys, Authentication;
docs/api.md: Tokens and keys, Idempotency-Key; docs/api.md: Submitting an export, Submit): each answers its problem
(docs/api.md: Error codes) and stores nothing, and the checks run in one fixed order: the key's syntax, the body,
membership, then the key's reuse.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import jwt
import pytest
from multidict import CIMultiDict

from services.api.http.problems import MAX_LISTED_ERRORS
from shared.auth import mint_token
from shared.settings import Settings
from tests.support.api_calls import challenge, expect_problem, make_conversation, submit
from tests.support.exports import GUESSED_ID, Auth, Client, post_export, stored

pytestmark = pytest.mark.module_database

NOTHING = dict.fromkeys(("operations", "idempotency_keys", "outbox"), 0)
VALID = {"format": "jsonl"}
# The default body limit (docs/reference/settings.md: Settings: CHATEXPORT_EXPORT_REQUEST_MAX_BYTES).
LIMIT = 64 * 1024


@pytest.fixture
async def members(api: Client, auth: Auth) -> None:
    """``c-a`` with alice and bob; ``c-other`` with carol only."""
    await make_conversation(api, auth, "c-a", ["alice", "bob"])
    await make_conversation(api, auth, "c-other", ["carol"])


def _tokens(settings: Settings) -> dict[str, str | None]:
    now = int(time.time())
    return {
        "missing": None,
        "expired": mint_token(settings, user_id="alice", ttl_seconds=-60),
        "badly signed": jwt.encode({"sub": "alice", "exp": now + 600}, "another-secret-of-32-bytes-or-more!", "HS256"),
        "without exp": jwt.encode({"sub": "alice"}, settings.jwt_secret, "HS256"),
        "unsigned": jwt.encode({"sub": "alice", "exp": now + 600}, "", "none"),
        "not a jwt": "not-a-jwt",
    }


async def test_bad_or_missing_token_is_401_before_any_other_check(
    api: Client, settings: Settings, pool: asyncpg.Pool, members: None
) -> None:
    for name, token in _tokens(settings).items():
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        # No Idempotency-Key and a broken body: 401 still comes first.
        response = await post_export(api, headers, "c-a", b"{", key=None)
        await expect_problem(response, 401, "UNAUTHENTICATED", case=name)
        description = "expired" if name == "expired" else "invalid"
        assert response.headers.get("WWW-Authenticate") == challenge(description), name
        if token is not None:
            assert token not in await response.text(), f"{name}: the token is echoed"
    response = await post_export(api, {"Authorization": "Basic YWxpY2U6cHc="}, "c-a", VALID)
    await expect_problem(response, 401, "UNAUTHENTICATED")
    assert response.headers.get("WWW-Authenticate") == challenge("invalid")
    assert await stored(pool) == NOTHING


async def test_two_authorization_fields_are_401_even_when_each_is_valid(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None, caplog: pytest.LogCaptureFixture
) -> None:
    alice, mallory = auth("alice")["Authorization"], auth("mallory")["Authorization"]
    for pair in ((alice, mallory), (alice, alice)):
        headers = CIMultiDict([("Authorization", pair[0]), ("Authorization", pair[1]), ("Idempotency-Key", "k-1")])
        with caplog.at_level(logging.INFO, logger="services.api.http.middlewares"):
            response = await api.post("/v3/conversations/c-a/exports", json=VALID, headers=headers)
        await expect_problem(response, 401, "UNAUTHENTICATED")
        assert response.headers["WWW-Authenticate"] == challenge("invalid")
    assert await stored(pool) == NOTHING
    reasons = [getattr(record, "reason", None) for record in caplog.records if record.getMessage() == "token refused"]
    assert reasons == ["several Authorization fields"] * 2
    assert not any(alice.split()[1] in record.getMessage() + str(record.__dict__) for record in caplog.records)


MALFORMED_KEYS = {
    "empty": "",
    "256 characters": "k" * 256,
    "non-ASCII": "caf\u00e9",
    "space": "two words",
    "unbalanced quote": '"abc',
    "empty quoted": '""',
    "quoted space": '"a b"',
    "bad escape": '"a\\c"',
}


async def test_missing_or_malformed_idempotency_key_is_400(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    response = await post_export(api, auth("alice"), "c-a", VALID, key=None)
    body = await expect_problem(response, 400, "IDEMPOTENCY_KEY_MISSING")
    assert "Idempotency-Key" in body["detail"]
    for name, key in MALFORMED_KEYS.items():
        response = await post_export(api, auth("alice"), "c-a", VALID, key=key)
        await expect_problem(response, 400, "IDEMPOTENCY_KEY_INVALID", case=name)
    assert await stored(pool) == NOTHING


async def test_two_idempotency_key_fields_are_400_whatever_their_values(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    for pair in (("k-1", "k-2"), ("k-1", "k-1"), ("k-1", "")):
        headers = CIMultiDict([*auth("alice").items(), ("Idempotency-Key", pair[0]), ("Idempotency-Key", pair[1])])
        response = await api.post("/v3/conversations/c-a/exports", json=VALID, headers=headers)
        body = await expect_problem(response, 400, "IDEMPOTENCY_KEY_INVALID", case=pair)
        assert "k-1" not in body["detail"]
    assert await stored(pool) == NOTHING


async def test_key_limits_are_inclusive_and_quotes_are_not_part_of_the_key(
    api: Client, auth: Auth, members: None
) -> None:
    first = await submit(api, auth, "alice", "c-a", VALID, "k" * 255)
    assert first.status == 202, await first.text()
    quoted = await submit(api, auth, "alice", "c-a", VALID, '"' + "k" * 255 + '"')
    assert quoted.status == 202, await quoted.text()
    assert quoted.headers["Location"] == first.headers["Location"]
    assert quoted.headers.get("Idempotent-Replayed") == "true"

    plain = await submit(api, auth, "alice", "c-a", VALID, "!~abc")
    assert plain.status == 202, await plain.text()
    assert plain.headers["Location"] != first.headers["Location"]

    sf_first = await submit(api, auth, "alice", "c-a", VALID, '"abc"')
    assert sf_first.status == 202, await sf_first.text()
    assert "Idempotent-Replayed" not in sf_first.headers
    sf_again = await submit(api, auth, "alice", "c-a", VALID, "abc")
    assert sf_again.status == 202
    assert sf_again.headers["Location"] == sf_first.headers["Location"]
    assert sf_again.headers.get("Idempotent-Replayed") == "true"


MALFORMED_BODIES = {
    "empty": b"",
    "truncated": b"{",
    "form encoded": b"format=jsonl",
    "trailing data": b'{"format":"jsonl"} {}',
    "not UTF-8": b'{"format":"jsonl","note":"\xff\xfe"}',
    "latin-1": '{"format":"jsonl","note":"\u00e9"}'.encode("latin-1"),
}


async def test_body_that_is_not_json_or_not_utf8_is_400(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    for name, raw in MALFORMED_BODIES.items():
        response = await post_export(api, auth("alice"), "c-a", raw)
        await expect_problem(response, 400, "MALFORMED_JSON", case=name)
    assert await stored(pool) == NOTHING


# body -> the ``loc`` one of the errors must name.
SCHEMA_VIOLATIONS: dict[bytes, list[Any]] = {
    b'{"format":"jsonl","extra":1}': ["body", "extra"],
    b'{"format":"xml"}': ["body", "format"],
    b'{"format":null}': ["body", "format"],
    b'{"since":"2026-03-08T01:30:00"}': ["body", "since"],
    b'{"since":"2026-03-08"}': ["body", "since"],
    b'{"until":"0999-12-31T23:59:59Z"}': ["body", "until"],
    b'{"since":"2026-03-08T10:00:00+01:00","until":"2026-03-08T09:00:00Z"}': ["body", "until"],
    b'{"since":"2026-03-08T10:00:00+01:00","until":"2026-03-08T09:00:00.000Z"}': ["body", "until"],
    b'{"since":"2026-01-01T00:00:00+05:99"}': ["body", "since"],
    b'{"until":"2026-01-01T00:00:00-00:60"}': ["body", "until"],
    b'{"senders":[]}': ["body", "senders"],
    b'{"senders":"alice"}': ["body", "senders"],
    b'{"senders":["' + b"a" * 65 + b'"]}': ["body", "senders", 0],
    b'{"senders":[' + b",".join(b'"u%d"' % n for n in range(101)) + b"]}": ["body", "senders"],
    b'{"compression":"zip"}': ["body", "compression"],
    b'{"max_part_bytes":5242879}': ["body", "max_part_bytes"],
    b'{"max_part_bytes":"5242880"}': ["body", "max_part_bytes"],
    b'{"parts":2}': ["body", "parts"],
    b'{"format":"jsonl","before_seq":0}': ["body", "before_seq"],
    b'{"format":"jsonl","before_seq":-1}': ["body", "before_seq"],
    b'{"format":"jsonl","before_seq":"9"}': ["body", "before_seq"],
    b'{"format":"jsonl","before_seq":1e3}': ["body", "before_seq"],
    b'{"format":"jsonl","before_seq":9.0}': ["body", "before_seq"],
    b'{"format":"jsonl","before_seq":true}': ["body", "before_seq"],
    b'{"format":"jsonl","before_seq":9223372036854775808}': ["body", "before_seq"],
    b'{"format":"jsonl","after_seq":-1}': ["body", "after_seq"],
    b'{"format":"jsonl","after_seq":"0"}': ["body", "after_seq"],
    b'{"format":"jsonl","after_seq":false}': ["body", "after_seq"],
    b'{"format":"jsonl","after_seq":9223372036854775808}': ["body", "after_seq"],
    b'{"format":"jsonl","before_seq":5,"after_seq":4}': ["body"],
    b'{"format":"jsonl","before_seq":5,"after_seq":9}': ["body"],
    b'{"format":"jsonl","before_seq":1,"after_seq":0}': ["body"],
    # The same canonical request as the line above (after_seq defaults to 0), so judged alike.
    b'{"format":"jsonl","before_seq":1}': ["body"],
    b'[{"format":"jsonl"}]': ["body"],
    b'"jsonl"': ["body"],
    b"null": ["body"],
}


async def test_schema_violation_is_422_with_errors(api: Client, auth: Auth, pool: asyncpg.Pool, members: None) -> None:
    for raw, loc in SCHEMA_VIOLATIONS.items():
        response = await post_export(api, auth("alice"), "c-a", raw)
        body = await expect_problem(response, 422, "VALIDATION_FAILED", case=raw)
        errors = body["errors"]
        assert errors, body
        for error in errors:
            assert set(error) == {"loc", "msg"}, (raw, error)
            assert isinstance(error["loc"], list), (raw, error)
            assert isinstance(error["msg"], str), (raw, error)
            assert error["msg"], (raw, error)
        assert loc in [error["loc"] for error in errors], (raw, errors)
    assert await stored(pool) == NOTHING
    # The bounds themselves are valid.
    response = await post_export(api, auth("alice"), "c-a", {"format": "jsonl", "before_seq": 5, "after_seq": 3})
    assert response.status == 202, await response.text()
    edge = {"format": "jsonl", "before_seq": 2**63 - 1, "after_seq": 2**63 - 3}
    response = await post_export(api, auth("alice"), "c-a", edge, key="key-2")
    assert response.status == 202, await response.text()


@pytest.mark.parametrize(
    ("body", "first"),
    [
        ({f"f{n}": 0 for n in range(6000)}, ["body", "f0"]),
        ({"format": "csv", "notify": {f"f{n}": 0 for n in range(6000)}}, ["body", "notify", "f0"]),
    ],
    ids=["top", "notify"],
)
async def test_thousands_of_unknown_members_get_a_short_422(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None, body: dict[str, Any], first: list[str]
) -> None:
    cases = [
        ("member", "/v3/conversations/c-a/exports", body, "alice"),
        ("non-member", "/v3/conversations/c-a/exports", body, "carol"),
        ("schedule", "/v3/conversations/c-a/export-schedules", {"every": "P1D", **body}, "alice"),
    ]
    for case, url, sent, user in cases:
        raw = json.dumps(sent, separators=(",", ":")).encode()
        assert len(raw) < LIMIT
        headers = {**auth(user), "Idempotency-Key": "k-1", "Content-Type": "application/json"}
        response = await api.post(url, data=raw, headers=headers)
        problem = await expect_problem(response, 422, "VALIDATION_FAILED", case=case)
        assert len(problem["errors"]) == MAX_LISTED_ERRORS, case
        assert problem["errors"][0] == {"loc": first, "msg": "Extra inputs are not permitted"}, case
        assert problem["error_count"] == 6000, case
        assert len(await response.read()) < 2048, case
    assert await stored(pool) == NOTHING
    assert await pool.fetchval("SELECT count(*) FROM export_schedules") == 0


async def test_a_few_errors_are_all_listed(api: Client, auth: Auth, members: None) -> None:
    response = await post_export(api, auth("alice"), "c-a", {"format": "xml", "after_seq": -1, "x": 1})
    problem = await expect_problem(response, 422, "VALIDATION_FAILED")
    locs = [error["loc"] for error in problem["errors"]]
    assert sorted(locs) == [["body", "after_seq"], ["body", "format"], ["body", "x"]]
    assert problem["error_count"] == 3


def test_the_documented_number_of_listed_errors_is_the_constant() -> None:
    assert f"at most {MAX_LISTED_ERRORS} errors" in (Path(__file__).parents[2] / "docs" / "api.md").read_text()


async def test_body_over_64_kib_is_413_and_64_kib_is_accepted(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    def padded(size: int) -> bytes:
        return b'{"format":"jsonl"' + b" " * (size - 18) + b"}"

    assert len(padded(LIMIT + 1)) == LIMIT + 1
    response = await post_export(api, auth("alice"), "c-a", padded(LIMIT + 1))
    await expect_problem(response, 413, "PAYLOAD_TOO_LARGE")
    response = await post_export(api, auth("alice"), "c-a", padded(2 * LIMIT))
    await expect_problem(response, 413, "PAYLOAD_TOO_LARGE")

    async def chunks() -> AsyncIterator[bytes]:
        # Without Content-Length: the limit holds for a streamed body too.
        for _ in range(LIMIT // 256 + 1):
            yield b" " * 256

    streamed = await api.post(
        "/v3/conversations/c-a/exports",
        data=chunks(),
        headers={**auth("alice"), "Idempotency-Key": "key-1", "Content-Type": "application/json"},
    )
    await expect_problem(streamed, 413, "PAYLOAD_TOO_LARGE")
    assert await stored(pool) == NOTHING

    accepted = await post_export(api, auth("alice"), "c-a", padded(LIMIT))
    assert accepted.status == 202, await accepted.text()


async def test_the_largest_valid_request_is_accepted_even_with_every_character_escaped(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    def escaped(text: str) -> str:
        return "".join(f"\\u{ord(char):04x}" for char in text)

    senders = [f"{number:03d}" + "s" * 61 for number in range(100)]
    notify = "https://hooks.example.com/" + "p" * (900 - len("https://hooks.example.com/"))
    listed = ",".join('"' + escaped(sender) + '"' for sender in senders)
    body = (
        '{"format":"csv","compression":"gzip","max_part_bytes":5242880,"after_seq":0,"before_seq":'
        f'{2**63 - 1},"since":"{escaped("2026-03-08T01:30:00.000-05:00")}",'
        f'"until":"{escaped("2026-03-08T03:30:00.000-04:00")}",'
        f'"senders":[{listed}],'
        f'"notify":{{"url":"{escaped(notify)}"}}}}'
    ).encode()
    assert 40_000 < len(body) <= LIMIT
    response = await post_export(api, auth("alice"), "c-a", body)
    assert response.status == 202, await response.text()
    assert (await response.json())["request"]["senders"] == senders


async def test_body_of_another_media_type_is_415(api: Client, auth: Auth, pool: asyncpg.Pool, members: None) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "application/x-ndjson"):
        response = await post_export(api, auth("alice"), "c-a", VALID, content_type=content_type)
        await expect_problem(response, 415, "UNSUPPORTED_MEDIA_TYPE", case=content_type)
    response = await post_export(api, auth("alice"), "c-a", VALID, content_type=None)
    await expect_problem(response, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert await stored(pool) == NOTHING

    for number, content_type in enumerate(("application/json; charset=utf-8", "Application/JSON")):
        response = await post_export(api, auth("alice"), "c-a", VALID, key=f"ct-{number}", content_type=content_type)
        assert response.status == 202, (content_type, await response.text())


async def test_checks_run_in_the_documented_order(api: Client, auth: Auth, pool: asyncpg.Pool, members: None) -> None:
    alice = auth("alice")
    too_large = b'{"format":"jsonl"' + b" " * LIMIT + b"}"
    # Idempotency-Key syntax before the body.
    cases = [
        (await post_export(api, alice, "c-a", b"{", key="a b"), 400, "IDEMPOTENCY_KEY_INVALID"),
        (await post_export(api, alice, "c-a", too_large, key="a b"), 400, "IDEMPOTENCY_KEY_INVALID"),
        (
            await post_export(api, alice, "c-a", VALID, key="a b", content_type="text/plain"),
            400,
            "IDEMPOTENCY_KEY_INVALID",
        ),
        (await post_export(api, alice, "c-a", b'{"format":"xml"}', key=None), 400, "IDEMPOTENCY_KEY_MISSING"),
        # Within the body: 415, then 413, then 400, then 422.
        (await post_export(api, alice, "c-a", too_large, content_type="text/plain"), 415, "UNSUPPORTED_MEDIA_TYPE"),
        (await post_export(api, alice, "c-a", too_large[:-1] + b"!"), 413, "PAYLOAD_TOO_LARGE"),
        # The body before membership: a non-member and a missing conversation get the body errors.
        (await post_export(api, alice, "c-other", b'{"format":"xml"}'), 422, "VALIDATION_FAILED"),
        (await post_export(api, alice, "c-nowhere", b'{"format":"xml"}'), 422, "VALIDATION_FAILED"),
        (await post_export(api, alice, "c-other", b"{"), 400, "MALFORMED_JSON"),
        (await post_export(api, alice, "c-other", too_large), 413, "PAYLOAD_TOO_LARGE"),
        (await post_export(api, alice, "c-other", VALID, content_type="text/plain"), 415, "UNSUPPORTED_MEDIA_TYPE"),
    ]
    for number, (response, status, code) in enumerate(cases):
        await expect_problem(response, status, code, case=number)
    assert await stored(pool) == NOTHING

    # Membership before idempotency: a key alice used in c-a, reused for a conversation she is not in, is
    # the members' 404 (not 409, which would reveal that c-other exists).
    first = await post_export(api, alice, "c-a", VALID, key="shared")
    assert first.status == 202
    outsider = await post_export(api, alice, "c-other", VALID, key="shared")
    await expect_problem(outsider, 404, "NOT_FOUND")
    assert await stored(pool) == dict.fromkeys(NOTHING, 1)


async def test_non_member_missing_and_malformed_conversations_get_the_same_404(
    api: Client, auth: Auth, pool: asyncpg.Pool, members: None
) -> None:
    alice = auth("alice")
    bodies = []
    for number, cid in enumerate(["c-other", "c-nowhere", "c" * 65, "c%20a", "%00", "c-a%00"]):
        response = await post_export(api, alice, cid, VALID, key=f"k-{number}")
        bodies.append(await expect_problem(response, 404, "NOT_FOUND", case=cid))
    guessed = await api.get(f"/v3/operations/{GUESSED_ID}", headers=alice)
    bodies.append(await expect_problem(guessed, 404, "NOT_FOUND"))
    assert all(body == bodies[0] for body in bodies), bodies
    assert await stored(pool) == NOTHING
