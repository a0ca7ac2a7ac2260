"""End to end: every export option through the real processes started from the compose file (docs/api.md: Submitting an
export, Export options).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from typing import Any

import pytest

from tests.support.api_calls import (
    Headers,
    expected_file,
    import_lines,
    make_conversation,
    read_all,
    succeeded,
)
from tests.support.exported_files import BODIES, FORMULAS, assert_self_contained, big_bodies, csv_rows, parsed

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024


async def fetched(live_api: Any, live_auth: Headers, url: str, sha256: str) -> bytes:
    response = await live_api.get(url, headers=live_auth("alice"))
    assert response.status == 200, await response.text()
    content: bytes = await response.read()
    assert hashlib.sha256(content).hexdigest() == sha256
    return content


async def single(live_api: Any, live_auth: Headers, cid: str, body: dict[str, Any], key: str) -> bytes:
    result = (await succeeded(live_api, live_auth, "alice", cid, body, key, timeout=120))["result"]
    return await fetched(live_api, live_auth, result["url"], result["sha256"])


async def test_windows_in_offsets_on_both_sides_of_utc_across_a_dst_change_and_senders(
    live_api: Any, live_auth: Headers
) -> None:
    await make_conversation(live_api, live_auth, "e2e-window", ["alice", "bob"])
    stamps = [f"2026-03-08T{hour:02d}:{minute:02d}:00.000Z" for hour in range(5, 10) for minute in (0, 30)]
    await import_lines(
        live_api,
        live_auth,
        "e2e-window",
        [
            {"message_id": stamp, "sender_id": ("alice", "bob")[n % 2], "body": stamp, "sent_at": stamp}
            for n, stamp in enumerate(stamps)
        ],
    )
    for number, (since, until) in enumerate(
        [("2026-03-08T01:30:00-05:00", "2026-03-08T03:30:00-04:00"), ("2026-03-08T12:00:00+05:30", None)]
    ):
        body = {"since": since} | ({"until": until} if until else {})
        content = await single(live_api, live_auth, "e2e-window", body, f"w{number}")
        expected = [
            stamp for stamp in stamps if stamp >= "2026-03-08T06:30" and (not until or stamp < "2026-03-08T07:30")
        ]
        assert [json.loads(line)["sent_at"] for line in content.splitlines()] == expected
    content = await single(live_api, live_auth, "e2e-window", {"senders": ["bob"]}, "senders")
    assert [json.loads(line)["sender_id"] for line in content.splitlines()] == ["bob"] * (len(stamps) // 2)


async def test_csv_html_and_gzip_give_back_every_body(live_api: Any, live_auth: Headers) -> None:
    await make_conversation(live_api, live_auth, "e2e-kinds", ["alice"])
    await import_lines(
        live_api,
        live_auth,
        "e2e-kinds",
        [{"message_id": f"m{n}", "sender_id": "alice", "body": b} for n, b in enumerate(BODIES)],
    )
    rows = csv_rows(await single(live_api, live_auth, "e2e-kinds", {"format": "csv"}, "csv"))
    assert [row[5] for row in rows[1:]] == [("'" + body if body in FORMULAS else body) for body in BODIES]
    transcript = parsed(await single(live_api, live_auth, "e2e-kinds", {"format": "html"}, "html"))
    assert transcript.bodies == BODIES
    assert_self_contained(transcript)
    packed = await single(live_api, live_auth, "e2e-kinds", {"compression": "gzip"}, "gzip")
    assert gzip.decompress(packed) == expected_file(await read_all(live_api, live_auth, "alice", "e2e-kinds"))


async def test_parts_of_every_format_open_on_their_own_and_jsonl_parts_make_the_single_file(
    live_api: Any, live_auth: Headers
) -> None:
    bodies = big_bodies(1600)
    await make_conversation(live_api, live_auth, "e2e-parts", ["alice"])
    await import_lines(
        live_api,
        live_auth,
        "e2e-parts",
        [{"message_id": f"m{n}", "sender_id": "alice", "body": b} for n, b in enumerate(bodies)],
    )
    whole = await single(live_api, live_auth, "e2e-parts", {}, "whole")
    for number, options in enumerate(({}, {"format": "csv", "compression": "gzip"}, {"format": "html"})):
        body = {**options, "max_part_bytes": 5 * MIB}
        operation = await succeeded(live_api, live_auth, "alice", "e2e-parts", body, f"parts-{number}", timeout=120)
        parts = operation["result"]["parts"]
        assert len(parts) == 2, options
        contents = [await fetched(live_api, live_auth, part["url"], part["sha256"]) for part in parts]
        if options.get("compression"):
            contents = [gzip.decompress(content) for content in contents]
        if not options:
            assert b"".join(contents) == whole
        elif options["format"] == "csv":
            assert [len(csv_rows(content)) - 1 for content in contents] == [p["message_count"] for p in parts]
        else:
            assert sum(len(parsed(content).bodies) for content in contents) == len(bodies)
