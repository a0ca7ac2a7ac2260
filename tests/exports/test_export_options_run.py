"""Export options run by the real relay, worker and janitor (docs/api.md: Submitting an export, Export options): time
windows across a DST change and offsets on both sides of UTC, senders, CSV, HTML, gzip, parts, incremental
exports, the estimate, and the download headers of each kind of file.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
from typing import Any

import pytest

from tests.support.api_calls import (
    expect_problem,
    expected_file,
    import_lines,
    make_conversation,
    read_all,
    submit,
    succeeded,
)
from tests.support.exported_files import (
    BODIES,
    FORMULAS,
    assert_self_contained,
    big_bodies,
    csv_rows,
    parsed,
    txt_messages,
)
from tests.support.exports import Auth, Client

pytestmark = pytest.mark.module_database

MIB = 1024 * 1024


async def download(api: Client, auth: Auth, url: str) -> tuple[bytes, Any]:
    response = await api.get(url, headers=auth("alice"))
    assert response.status == 200, await response.text()
    return await response.read(), response.headers


async def conversation_of(api: Client, auth: Auth, cid: str, bodies: list[str], **fields: Any) -> list[dict[str, Any]]:
    """``cid`` with alice and bob and one message per body, alternating senders; the messages as read."""
    await make_conversation(api, auth, cid, ["alice", "bob"])
    await import_lines(
        api,
        auth,
        cid,
        [
            {"message_id": f"m{n}", "sender_id": ("alice", "bob")[n % 2], "body": body, **fields}
            for n, body in enumerate(bodies)
        ],
    )
    return await read_all(api, auth, "alice", cid)


async def test_csv_gives_back_every_body_and_guards_formula_cells(api: Client, auth: Auth, pipeline: None) -> None:
    messages = await conversation_of(api, auth, "c-csv", BODIES)
    operation = await succeeded(api, auth, "alice", "c-csv", {"format": "csv"}, "k-1")
    result = operation["result"]
    assert result["content_type"] == "text/csv; charset=utf-8"
    assert result["message_count"] == len(BODIES)
    content, headers = await download(api, auth, result["url"])
    assert headers["Content-Type"] == "text/csv; charset=utf-8"
    assert headers["Content-Disposition"] == f'attachment; filename="c-csv-{operation["created_at"][:10]}.csv"'
    assert hashlib.sha256(content).hexdigest() == result["sha256"] and len(content) == result["size_bytes"]

    rows = csv_rows(content)
    assert rows[0] == [
        "conversation_id",
        "seq",
        "message_id",
        "sender_id",
        "sent_at",
        "body",
        "reply_to",
        "edited_at",
        "attachments",
    ]
    assert [row[:5] for row in rows[1:]] == [
        [m["conversation_id"], str(m["seq"]), m["message_id"], m["sender_id"], m["sent_at"]] for m in messages
    ]
    assert [row[5] for row in rows[1:]] == [("'" + body if body in FORMULAS else body) for body in BODIES]
    # Neither a reply nor edited, nor carrying a file: their cells are empty.
    assert {tuple(row[6:]) for row in rows[1:]} == {("", "", "")}
    assert content.endswith(b"\r\n")


async def test_csv_guards_the_ids_users_chose_as_it_guards_bodies(api: Client, auth: Auth, pipeline: None) -> None:
    await make_conversation(api, auth, "-c-ids", ["alice", "-bob"])
    lines = [{"message_id": message_id, "sender_id": "-bob", "body": "x"} for message_id in FORMULAS]
    await import_lines(api, auth, "-c-ids", lines)
    operation = await succeeded(api, auth, "alice", "-c-ids", {"format": "csv"}, "k-1")
    content, _ = await download(api, auth, operation["result"]["url"])
    rows = csv_rows(content)
    assert [(row[0], row[2], row[3]) for row in rows[1:]] == [("'-c-ids", "'" + m, "'-bob") for m in FORMULAS]


async def test_html_gives_back_every_body_as_text_grouped_by_day(api: Client, auth: Auth, pipeline: None) -> None:
    await make_conversation(api, auth, "c-html", ["alice", "bob"])
    days = ["2026-11-29T23:59:59.000Z", "2026-11-30T00:00:00.000Z"]
    await import_lines(
        api,
        auth,
        "c-html",
        [
            {"message_id": f"m{n}", "sender_id": "bob", "body": body, "sent_at": days[n * 2 // len(BODIES)]}
            for n, body in enumerate(BODIES)
        ],
    )
    operation = await succeeded(api, auth, "alice", "c-html", {"format": "html"}, "k-1")
    content, headers = await download(api, auth, operation["result"]["url"])
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["Content-Security-Policy"] == "sandbox"
    assert headers["X-Content-Type-Options"] == "nosniff"
    transcript = parsed(content)
    assert transcript.bodies == BODIES
    assert_self_contained(transcript)
    assert [attrs["datetime"] for tag, attrs in transcript.tags if tag == "time" and len(attrs["datetime"] or "") == 10]
    assert content.count(b"<section>") == 2  # one per day, in UTC
    assert content.count(b'dir="auto"') >= 2 * len(BODIES)


async def test_txt_gives_back_every_message_one_line_each(api: Client, auth: Auth, pipeline: None) -> None:
    messages = await conversation_of(api, auth, "c-txt", BODIES)
    operation = await succeeded(api, auth, "alice", "c-txt", {"format": "txt"}, "k-1")
    result = operation["result"]
    assert (result["content_type"], result["message_count"]) == ("text/plain; charset=utf-8", len(BODIES))
    content, headers = await download(api, auth, result["url"])
    assert hashlib.sha256(content).hexdigest() == result["sha256"]
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert headers["Content-Disposition"].endswith('.txt"')
    # Bodies with line feeds, CRLF, U+2028 and formula signs: still one line each.
    assert len(content.decode("utf-8").splitlines()) == result["message_count"]
    assert txt_messages(content) == [
        (message["sent_at"].replace("T", " "), message["sender_id"], message["body"]) for message in messages
    ]


async def test_gzip_decompresses_to_the_uncompressed_file(api: Client, auth: Auth, pipeline: None) -> None:
    messages = await conversation_of(api, auth, "c-gz", BODIES * 20)
    plain = await succeeded(api, auth, "alice", "c-gz", {}, "k-plain")
    packed = await succeeded(api, auth, "alice", "c-gz", {"compression": "gzip"}, "k-gz")
    result = packed["result"]
    assert (result["content_type"], result["message_count"]) == ("application/gzip", len(messages))
    content, headers = await download(api, auth, result["url"])
    assert hashlib.sha256(content).hexdigest() == result["sha256"] and len(content) == result["size_bytes"]
    assert headers["Content-Type"] == "application/gzip"
    assert headers["Content-Disposition"].endswith('.jsonl.gz"')
    assert gzip.decompress(content) == expected_file(messages)
    assert gzip.decompress(content) == (await download(api, auth, plain["result"]["url"]))[0]
    assert len(content) < plain["result"]["size_bytes"]


async def test_a_window_across_a_dst_change_in_any_offset_selects_the_same_instants(
    api: Client, auth: Auth, pipeline: None
) -> None:
    await make_conversation(api, auth, "c-dst", ["alice", "bob"])
    # Every 30 minutes around 2026-03-08 07:00Z, when New York moved from -05:00 to -04:00.
    stamps = [f"2026-03-08T{hour:02d}:{minute:02d}:00.000Z" for hour in range(5, 10) for minute in (0, 30)]
    await import_lines(
        api,
        auth,
        "c-dst",
        [
            {"message_id": f"m{n}", "sender_id": "bob", "body": stamp, "sent_at": stamp}
            for n, stamp in enumerate(stamps)
        ],
    )
    wanted = ["2026-03-08T06:30:00.000Z", "2026-03-08T07:00:00.000Z"]
    windows = {
        "new york": ("2026-03-08T01:30:00-05:00", "2026-03-08T03:30:00-04:00"),
        "india": ("2026-03-08T12:00:00+05:30", "2026-03-08T13:00:00+05:30"),
        "utc": ("2026-03-08T06:30:00Z", "2026-03-08T07:30:00.000z"),
        "los angeles": ("2026-03-07T22:30:00-08:00", "2026-03-07T23:30:00-08:00"),
    }
    operation_ids = set()
    for name, (since, until) in windows.items():
        operation = await succeeded(api, auth, "alice", "c-dst", {"since": since, "until": until}, "k-window")
        content, _ = await download(api, auth, operation["result"]["url"])
        assert [json.loads(line)["sent_at"] for line in content.splitlines()] == wanted, name
        assert operation["request"]["since"] == "2026-03-08T06:30:00.000Z", name
        assert operation["request"]["until"] == "2026-03-08T07:30:00.000Z", name
        operation_ids.add(operation["operation_id"])
    # The same instants are the same request: one key, one operation (docs/api.md: Submitting an export, Submit).
    assert len(operation_ids) == 1
    other = await submit(api, auth, "alice", "c-dst", {"since": "2026-03-08T06:30:00.001Z"}, "k-window")
    await expect_problem(other, 409, "IDEMPOTENCY_KEY_REUSED")


async def test_senders_and_seq_range_combine_with_the_window(api: Client, auth: Auth, pipeline: None) -> None:
    await make_conversation(api, auth, "c-who", ["alice", "bob", "carol"])
    await import_lines(
        api,
        auth,
        "c-who",
        [
            {
                "message_id": f"m{n}",
                "sender_id": ("alice", "bob", "carol")[n % 3],
                "body": f"b{n}",
                "sent_at": f"2026-01-01T00:{n:02d}:00Z",
            }
            for n in range(30)
        ],
    )
    body = {"senders": ["carol", "bob", "bob"], "after_seq": 3, "before_seq": 25, "until": "2026-01-01T00:20:00Z"}
    operation = await succeeded(api, auth, "alice", "c-who", body, "k-1")
    content, _ = await download(api, auth, operation["result"]["url"])
    chosen = [json.loads(line) for line in content.splitlines()]
    # seq n+1 is message n: seqs 4..24, minutes below 20, bob (n % 3 == 1) or carol (n % 3 == 2).
    assert [m["seq"] for m in chosen] == [n + 1 for n in range(3, 20) if n % 3 != 0]
    assert operation["request"]["senders"] == ["bob", "carol"]
    assert operation["estimate"] == {"messages_at_most": 21, "bytes": None}
    assert operation["result"]["message_count"] == len(chosen)
    # The same set of senders in another order is the same request.
    again = await submit(api, auth, "alice", "c-who", {**body, "senders": ["bob", "carol"]}, "k-1")
    assert again.status == 202 and again.headers.get("Idempotent-Replayed") == "true"


async def test_an_incremental_export_starts_after_the_watermark(api: Client, auth: Auth, pipeline: None) -> None:
    first_messages = await conversation_of(api, auth, "c-inc", BODIES)
    first = await succeeded(api, auth, "alice", "c-inc", {}, "k-1")
    watermark = first["result"]["next_after_seq"]
    assert watermark == first_messages[-1]["seq"] == first["snapshot"]["max_seq"]
    assert first["estimate"] == {"messages_at_most": len(BODIES), "bytes": None}
    await import_lines(api, auth, "c-inc", [{"message_id": "new", "sender_id": "bob", "body": "new one"}])
    second = await succeeded(api, auth, "alice", "c-inc", {"after_seq": watermark}, "k-2")
    content, _ = await download(api, auth, second["result"]["url"])
    assert [json.loads(line)["body"] for line in content.splitlines()] == ["new one"]
    assert second["result"]["next_after_seq"] == watermark + 1
    nothing_new = await succeeded(api, auth, "alice", "c-inc", {"after_seq": watermark + 1}, "k-3")
    assert (nothing_new["result"]["message_count"], nothing_new["result"]["next_after_seq"]) == (0, watermark + 1)


async def test_jsonl_parts_concatenate_to_the_single_file(api: Client, auth: Auth, pipeline: None) -> None:
    bodies = big_bodies(2800)  # about 11.5 MB of JSONL: three parts of at most 5 MiB
    await conversation_of(api, auth, "c-parts", bodies)
    single = await succeeded(api, auth, "alice", "c-parts", {}, "k-single")
    split = await succeeded(api, auth, "alice", "c-parts", {"max_part_bytes": 5 * MIB}, "k-split")
    result = split["result"]
    assert "url" not in result and "size_bytes" not in result and "sha256" not in result
    parts = result["parts"]
    assert [part["number"] for part in parts] == [1, 2, 3]
    assert parts[0]["first_seq"] == 1 and parts[-1]["last_seq"] == len(bodies)
    assert all(later["first_seq"] == earlier["last_seq"] + 1 for earlier, later in itertools.pairwise(parts))
    assert sum(part["message_count"] for part in parts) == result["message_count"] == len(bodies)
    contents = []
    for part in parts:
        assert part["url"] == f"/v3/exports/{split['operation_id']}/result/parts/{part['number']}"
        content, headers = await download(api, auth, part["url"])
        assert len(content) == part["size_bytes"] <= 5 * MIB
        assert hashlib.sha256(content).hexdigest() == part["sha256"]
        assert headers["ETag"] == f'"{part["sha256"]}"'
        assert headers["Content-Disposition"].endswith(f'.part-{part["number"]}.jsonl"')
        contents.append(content)
    assert b"".join(contents) == (await download(api, auth, single["result"]["url"]))[0]

    ranged = await api.get(parts[1]["url"], headers={**auth("alice"), "Range": "bytes=0-9"})
    assert (ranged.status, await ranged.read()) == (206, contents[1][:10])
    cached = await api.get(parts[1]["url"], headers={**auth("alice"), "If-None-Match": f'"{parts[1]["sha256"]}"'})
    assert cached.status == 304
    whole = await api.get(f"/v3/exports/{split['operation_id']}/result", headers=auth("alice"))
    await expect_problem(whole, 409, "RESULT_IN_PARTS")
    for missing in ("0", "4", "01"):
        response = await api.get(f"{parts[0]['url'][:-1]}{missing}", headers=auth("alice"))
        await expect_problem(response, 404, "NOT_FOUND", case=missing)
    await expect_problem(await api.get(parts[0]["url"], headers=auth("bob")), 404, "NOT_FOUND")
    await expect_problem(await api.get(f"{single['result']['url']}/parts/1", headers=auth("alice")), 404, "NOT_FOUND")


async def test_every_part_of_every_format_opens_on_its_own(api: Client, auth: Auth, pipeline: None) -> None:
    bodies = big_bodies(1600)  # about 6.6 MB of JSONL: two parts in every format
    await conversation_of(api, auth, "c-kinds", bodies)
    for number, options in enumerate(
        (
            {"format": "csv"},
            {"format": "html"},
            {"format": "csv", "compression": "gzip"},
            {"compression": "gzip"},
            {"format": "txt", "compression": "gzip"},
        )
    ):
        body = {**options, "max_part_bytes": 5 * MIB}
        operation = await succeeded(api, auth, "alice", "c-kinds", body, f"k-{number}")
        parts = operation["result"]["parts"]
        assert len(parts) >= 2, options
        seen: list[str] = []
        for part in parts:
            content, _ = await download(api, auth, part["url"])
            if options.get("compression") == "gzip":
                content = gzip.decompress(content)  # each part is a gzip stream of its own
            assert len(content) <= 5 * MIB, options
            text = content.decode("utf-8")
            if options.get("format") == "csv":
                rows = csv_rows(content)
                assert rows[0][0] == "conversation_id", options
                seen += [row[5] for row in rows[1:]]
            elif options.get("format") == "html":
                assert text.startswith("<!DOCTYPE html>") and text.endswith("</html>\n")
                transcript = parsed(content)
                assert_self_contained(transcript)
                seen += transcript.bodies
            elif options.get("format") == "txt":
                lines = txt_messages(content)
                assert len(text.splitlines()) == len(lines) == part["message_count"], options
                seen += [body for _, _, body in lines]
            else:
                seen += [json.loads(line)["body"] for line in text.splitlines()]
        guarded = options.get("format") == "csv"
        assert seen == [("'" + body if guarded and body.startswith("=") else body) for body in bodies], options
