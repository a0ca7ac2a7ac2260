"""Conditional requests on a result (RFC 9110 section 13; docs/api.md: Downloads, Conditional downloads)
through the real API: 304 and 412 with their headers and access events, If-Range deciding between 206 and
the whole file, and preconditions evaluated only after authorization.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from email.utils import format_datetime, parsedate_to_datetime
from typing import Any

import asyncpg
import pytest
from multidict import CIMultiDict

from tests.support.api_calls import (
    expect_problem,
    expected_file,
    import_lines,
    make_conversation,
    read_all,
    submit,
    wait_terminal,
)
from tests.support.exports import Auth, Client, download_events

pytestmark = pytest.mark.module_database


async def _published(api: Client, auth: Auth) -> tuple[str, bytes]:
    """alice's SUCCEEDED export of a 20-message ``c-cond`` (members alice and bob): (result URL, file)."""
    await make_conversation(api, auth, "c-cond", ["alice", "bob"])
    await import_lines(
        api, auth, "c-cond", [{"message_id": f"m{n}", "sender_id": "alice", "body": f"body {n}"} for n in range(20)]
    )
    response = await submit(api, auth, "alice", "c-cond", {"format": "jsonl"}, "k-cond")
    operation = await wait_terminal(api, auth, "alice", response.headers["Location"])
    assert operation["state"] == "SUCCEEDED", operation
    return operation["result"]["url"], expected_file(await read_all(api, auth, "alice", "c-cond"))


async def test_conditional_gets_and_if_range(api: Client, auth: Auth, pool: asyncpg.Pool, pipeline: None) -> None:
    url, content = await _published(api, auth)
    etag = f'"{hashlib.sha256(content).hexdigest()}"'
    operation_id = url.split("/")[3]
    alice = auth("alice")

    full = await api.get(url, headers=alice)
    assert full.status == 200 and await full.read() == content
    assert full.headers["ETag"] == etag
    last_modified = full.headers["Last-Modified"]
    published = parsedate_to_datetime(last_modified)
    finished_at = await pool.fetchval("SELECT finished_at FROM operations WHERE operation_id = $1", operation_id)
    assert published == finished_at.replace(microsecond=0)
    before = format_datetime(published - timedelta(seconds=1), usegmt=True)

    for method in ("GET", "HEAD"):
        for condition in (
            {"If-None-Match": etag},
            {"If-None-Match": f"W/{etag}"},
            {"If-Modified-Since": last_modified},
        ):
            cached = await api.request(method, url, headers={**alice, **condition})
            assert cached.status == 304, (method, condition)
            assert await cached.read() == b""
            assert cached.headers["ETag"] == etag
            assert cached.headers["Last-Modified"] == last_modified
            assert cached.headers["Cache-Control"] == "no-store"
        refused = await api.request(method, url, headers={**alice, "If-Match": '"other"'})
        assert refused.status == 412
    await expect_problem(await api.get(url, headers={**alice, "If-Match": f"W/{etag}"}), 412, "PRECONDITION_FAILED")
    await expect_problem(
        await api.get(url, headers={**alice, "If-Unmodified-Since": before}), 412, "PRECONDITION_FAILED"
    )
    changed = await api.get(url, headers={**alice, "If-None-Match": '"other"', "If-Match": etag})
    assert changed.status == 200 and await changed.read() == content

    whole_file = {"other tag": '"other"', "weak own tag": f"W/{etag}", "another date": before, "junk": "junk"}
    for case, if_range in whole_file.items():
        response = await api.get(url, headers={**alice, "Range": "bytes=100-", "If-Range": if_range})
        assert response.status == 200, case
        assert await response.read() == content, case
        assert "Content-Range" not in response.headers, case
    for case, if_range in {"own tag": etag, "Last-Modified": last_modified}.items():
        response = await api.get(url, headers={**alice, "Range": "bytes=100-", "If-Range": if_range})
        assert response.status == 206, case
        assert await response.read() == content[100:], case
        assert response.headers["Content-Range"] == f"bytes 100-{len(content) - 1}/{len(content)}", case

    outcomes = [outcome for _, outcome in await download_events(pool, operation_id)]
    assert outcomes.count("NOT_MODIFIED") == 6
    assert outcomes.count("PRECONDITION_FAILED") == 4


async def test_preconditions_come_after_authorization(
    api: Client, auth: Auth, pool: asyncpg.Pool, pipeline: None
) -> None:
    url, content = await _published(api, auth)
    etag = f'"{hashlib.sha256(content).hexdigest()}"'
    unknown = url.replace(url.split("/")[3], "op_AAAAAAAAAAAAAAAAAAAAAAAA")
    bodies: list[Any] = []
    for user, target in (("bob", url), ("carol", url), ("alice", unknown)):
        for condition in ({"If-None-Match": etag}, {"If-Match": '"other"'}):
            problem = await expect_problem(await api.get(target, headers={**auth(user), **condition}), 404, "NOT_FOUND")
            bodies.append(problem)
    assert all(body == bodies[0] for body in bodies)
    removed = await api.delete("/admin/conversations/c-cond/members/alice", headers=auth("root", admin=True))
    assert removed.status == 204
    revoked = await api.get(url, headers={**auth("alice"), "If-None-Match": etag})
    await expect_problem(revoked, 403, "ACCESS_REVOKED")


async def test_repeated_fields_and_dates_out_of_range(api: Client, auth: Auth, pipeline: None) -> None:
    """A singleton field sent twice (``Range``, ``If-Range``, a date) is ignored, the lines of a list field
    make one list, and no date, however far out, is a 500 (docs/api.md: Downloads, Conditional downloads).
    """
    url, content = await _published(api, auth)
    etag = f'"{hashlib.sha256(content).hexdigest()}"'
    alice = list(auth("alice").items())
    whole_file = {
        "two Ranges": [("Range", "bytes=100-"), ("Range", "bytes=100-")],
        "two If-Ranges": [("Range", "bytes=100-"), ("If-Range", etag), ("If-Range", etag)],
        "two If-None-Match dates": [("If-Modified-Since", "Mon, 01 Jan 2024 00:00:00 GMT")] * 2,
        "empty If-Match elements": [("If-Match", f'"x", , {etag}')],
        "If-Match over two lines": [("If-Match", '"x"'), ("If-Match", etag)],
    }
    far_out = ("Mon, 01 Jan 0001 00:00:00 +0100", "Fri, 31 Dec 9999 23:59:59 -2359", "Sat, 01 Jan 10000 00:00:00 GMT")
    for date in far_out:
        whole_file[f"If-Range: {date}"] = [("Range", "bytes=100-"), ("If-Range", date)]
        for name in ("If-Modified-Since", "If-Unmodified-Since"):
            whole_file[f"{name}: {date}"] = [(name, date)]
    for case, lines in whole_file.items():
        response = await api.get(url, headers=CIMultiDict([*alice, *lines]))
        assert response.status == 200, case
        assert await response.read() == content, case
    not_modified = await api.get(url, headers=CIMultiDict([*alice, ("If-None-Match", '"x"'), ("If-None-Match", etag)]))
    assert not_modified.status == 304
