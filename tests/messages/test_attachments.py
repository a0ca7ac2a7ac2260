"""Attachments (docs/api.md: Message store, Attachments): a member uploads a file, measured as it streams into the
bucket; a send carries it; members fetch it while a message not recalled carries it; exports list it in every
format; the janitor removes what unfinished uploads leave.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import zlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest

from devtools.moto import MotoServer
from services.api.http.keys import SETTINGS, s3_client
from services.janitor.janitor import Janitor
from shared.settings import Settings
from shared.storage import ensure_bucket
from tests.support import wait_for
from tests.support.api_calls import every_format, expect_problem, expected_file, make_conversation, read_all
from tests.support.exported_files import csv_rows
from tests.support.messages import Auth, Client, configured_api, send, send_with, upload, uploaded

pytestmark = pytest.mark.module_database


async def fetched(api: Client, auth: Auth, user: str, cid: str, attachment_id: str) -> tuple[bytes, Any]:
    answer = await api.get(
        f"/v2/conversations/{cid}/attachments/{attachment_id}", headers=auth(user), allow_redirects=False
    )
    assert answer.status == 303, await answer.text()
    async with aiohttp.ClientSession() as session, session.get(answer.headers["Location"]) as stored:
        assert stored.status == 200
        return await stored.read(), stored.headers


async def test_an_upload_is_measured_carried_and_fetched(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    data = b"\x89PNG\r\n\x1a\n" + os.urandom(3000)
    stored = await uploaded(api, auth, "u-a", chat, "image.png", data, "image/png")
    assert stored["size_bytes"] == len(data) and stored["sha256"] == hashlib.sha256(data).hexdigest()
    crc32 = await pool.fetchval("SELECT crc32 FROM attachments WHERE attachment_id = $1", stored["attachment_id"])
    assert crc32 == zlib.crc32(data)

    answer = await send_with(api, auth, "u-a", chat, "m-1", [stored["attachment_id"]])
    assert answer.status == 200, await answer.text()
    (message,) = await read_all(api, auth, "u-b", chat)
    assert message["attachments"] == [
        {
            "attachment_id": stored["attachment_id"],
            "file_name": "image.png",
            "content_type": "image/png",
            "size_bytes": 3008,
        }
    ]
    content, headers = await fetched(api, auth, "u-b", chat, stored["attachment_id"])
    assert content == data
    assert headers["Content-Disposition"] == 'attachment; filename="image.png"'


async def test_a_big_upload_goes_in_parts(settings: Settings, moto: MotoServer, auth: Auth, pool: asyncpg.Pool) -> None:
    part = 5 * 1024 * 1024
    data = os.urandom(2 * part + 12345)
    async with configured_api(settings, moto, s3_part_size_bytes=part) as api:
        await ensure_bucket(s3_client(api.app), api.app[SETTINGS].s3_bucket)
        await make_conversation(api, auth, "c-big", ["u-a"])
        stored = await uploaded(api, auth, "u-a", "c-big", "big.bin", data, "application/octet-stream")
        answer = await send_with(api, auth, "u-a", "c-big", "m-1", [stored["attachment_id"]])
        assert answer.status == 200
        content, _ = await fetched(api, auth, "u-a", "c-big", stored["attachment_id"])
    assert content == data
    row = await pool.fetchrow(
        "SELECT size_bytes, crc32 FROM attachments WHERE attachment_id = $1", stored["attachment_id"]
    )
    assert (row["size_bytes"], row["crc32"]) == (len(data), zlib.crc32(data))


async def test_a_refused_upload_leaves_nothing(
    settings: Settings, moto: MotoServer, auth: Auth, pool: asyncpg.Pool
) -> None:
    async with configured_api(settings, moto, attachment_max_bytes=1000) as api:
        await ensure_bucket(s3_client(api.app), api.app[SETTINGS].s3_bucket)
        await make_conversation(api, auth, "c-refused", ["u-a"])
        refusals = [
            (await upload(api, auth, "u-a", "c-refused", "a.bin", b"x" * 1001, "a/b"), 413, "PAYLOAD_TOO_LARGE"),
            (await upload(api, auth, "u-x", "c-refused", "a.bin", b"x", "a/b"), 404, "NOT_FOUND"),
            (await upload(api, auth, "u-a", "c-refused", "a.bin", b"x", "nonsense"), 415, "UNSUPPORTED_MEDIA_TYPE"),
            (await upload(api, auth, "u-a", "c-refused", "a\x00b", b"x", "a/b"), 422, "VALIDATION_FAILED"),
            (
                await api.post("/v2/conversations/c-refused/attachments", data=b"x", headers=auth("u-a")),
                422,
                "VALIDATION_FAILED",
            ),
        ]
        for answer, status, code in refusals:
            await expect_problem(answer, status, code)
        app_settings = api.app[SETTINGS]
        listed = await s3_client(api.app).list_objects_v2(
            Bucket=app_settings.s3_bucket, Prefix=app_settings.s3_attachment_prefix
        )
    assert listed.get("KeyCount") == 0
    assert await pool.fetchval("SELECT count(*) FROM attachments") == 0


async def test_only_the_uploader_attaches_and_a_recall_stops_serving(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    mine = await uploaded(api, auth, "u-a", chat, "a.txt", b"a", "text/plain")
    theirs = await uploaded(api, auth, "u-b", chat, "b.txt", b"b", "text/plain")
    await make_conversation(api, auth, "c-other", ["u-a", "u-b"])
    elsewhere = await uploaded(api, auth, "u-a", "c-other", "c.txt", b"c", "text/plain")

    for ids, position in (
        ([mine["attachment_id"], theirs["attachment_id"]], 1),
        ([elsewhere["attachment_id"]], 0),
        (["att_none"], 0),
    ):
        body = await expect_problem(await send_with(api, auth, "u-a", chat, "m-1", ids), 422, "ATTACHMENT_NOT_FOUND")
        assert body["errors"][0]["loc"] == ["body", "attachments", position]
    twice = await send_with(api, auth, "u-a", chat, "m-1", [mine["attachment_id"]] * 2)
    await expect_problem(twice, 422, "VALIDATION_FAILED")
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE conversation_id = $1", chat) == 0

    # Before any message carries it, only its uploader fetches it.
    await fetched(api, auth, "u-a", chat, mine["attachment_id"])
    hidden = await api.get(f"/v2/conversations/{chat}/attachments/{mine['attachment_id']}", headers=auth("u-b"))
    await expect_problem(hidden, 404, "NOT_FOUND")
    assert (await send_with(api, auth, "u-a", chat, "m-1", [mine["attachment_id"]])).status == 200
    await fetched(api, auth, "u-b", chat, mine["attachment_id"])
    outsider = await api.get(f"/v2/conversations/{chat}/attachments/{mine['attachment_id']}", headers=auth("u-x"))
    await expect_problem(outsider, 404, "NOT_FOUND")

    await api.delete(f"/v2/conversations/{chat}/messages/m-1", headers=auth("u-a"))
    for user in ("u-a", "u-b"):
        gone = await api.get(f"/v2/conversations/{chat}/attachments/{mine['attachment_id']}", headers=auth(user))
        await expect_problem(gone, 404, "NOT_FOUND")


async def test_attachments_show_in_every_format(api: Client, auth: Auth, pipeline: None) -> None:
    await make_conversation(api, auth, "c-fmt", ["alice", "bob"])
    photo = await uploaded(api, auth, "alice", "c-fmt", "photo <1>.png", b"p" * 51200, "image/png")
    notes = await uploaded(api, auth, "alice", "c-fmt", "notes.txt", b"n" * 10, "text/plain")
    await send(api, auth, "bob", "c-fmt", "m-0", "hi")
    assert (
        await send_with(api, auth, "alice", "c-fmt", "m-1", [photo["attachment_id"], notes["attachment_id"]])
    ).status == 200
    messages = await read_all(api, auth, "alice", "c-fmt")
    assert "attachments" not in messages[0]

    files = await every_format(api, auth, "alice", "c-fmt")

    assert files["jsonl"] == expected_file(messages)
    header, first, second = csv_rows(files["csv"])
    assert header[-1] == "attachments" and first[-1] == ""
    assert json.loads(second[-1]) == messages[1]["attachments"]
    html = files["html"].decode()
    assert '<li><span dir="auto">photo &lt;1&gt;.png</span> (51200 bytes, image/png)</li>' in html
    txt = files["txt"].decode().splitlines()
    assert txt[1].endswith("] alice: see [attachment: photo <1>.png (51200 bytes)] [attachment: notes.txt (10 bytes)]")


async def test_the_janitor_removes_what_uploads_left(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool, s3: Any, settings: Settings
) -> None:
    kept = await uploaded(api, auth, "u-a", chat, "kept.txt", b"k", "text/plain")
    prefix = settings.s3_attachment_prefix
    # An api that stopped midway: its row UPLOADING, its object (or a part of it) stored.
    await pool.execute(
        "INSERT INTO attachments (attachment_id, conversation_id, uploader_id, file_name, content_type, object_key,"
        " state) VALUES ('att_lost', $1, 'u-a', 'lost.bin', 'a/b', $2, 'UPLOADING')",
        chat,
        f"{prefix}att_lost",
    )
    await s3.put_object(Bucket=settings.s3_bucket, Key=f"{prefix}att_lost", Body=b"l")
    started = await s3.create_multipart_upload(Bucket=settings.s3_bucket, Key=f"{prefix}att_lost")
    # A row forgotten while its object stayed.
    await s3.put_object(Bucket=settings.s3_bucket, Key=f"{prefix}att_forgotten", Body=b"f")

    # S3 dates objects to the second: a grace below zero takes what was just stored.
    janitor = Janitor(pool=pool, s3=s3, settings=settings.model_copy(update={"janitor_orphan_grace_seconds": -1}))
    assert await janitor.reconcile_attachments() == 2
    assert await janitor.reconcile_attachments() == 0

    listed = await s3.list_objects_v2(Bucket=settings.s3_bucket, Prefix=prefix)
    assert [item["Key"] for item in listed["Contents"]] == [f"{prefix}{kept['attachment_id']}"]
    uploads = await s3.list_multipart_uploads(Bucket=settings.s3_bucket, Prefix=prefix)
    assert started["UploadId"] not in [item["UploadId"] for item in uploads.get("Uploads", [])]
    assert await pool.fetchval("SELECT array_agg(attachment_id) FROM attachments") == [kept["attachment_id"]]


async def test_uploads_a_user_holds_at_once_are_capped(
    settings: Settings, moto: MotoServer, auth: Auth, pool: asyncpg.Pool
) -> None:
    async with configured_api(settings, moto, upload_per_user_concurrency=1) as api:
        await ensure_bucket(s3_client(api.app), api.app[SETTINGS].s3_bucket)
        await make_conversation(api, auth, "c-slots", ["u-a", "u-b"])
        started, finish = asyncio.Event(), asyncio.Event()

        async def slow_body() -> AsyncIterator[bytes]:
            yield b"first "
            started.set()
            await finish.wait()
            yield b"last"

        slow = asyncio.create_task(upload(api, auth, "u-a", "c-slots", "slow.txt", slow_body(), "text/plain"))
        await asyncio.wait_for(started.wait(), 10)
        await wait_for(lambda: _uploading(pool), timeout=10)

        refused = await upload(api, auth, "u-a", "c-slots", "b.txt", b"b", "text/plain")
        assert refused.headers["Retry-After"] == "5"
        await expect_problem(refused, 429, "TOO_MANY_UPLOADS")
        other = await upload(api, auth, "u-b", "c-slots", "c.txt", b"c", "text/plain")
        assert other.status == 201  # another user is not held up
        finish.set()
        answer = await slow
        assert answer.status == 201 and (await answer.json())["size_bytes"] == len(b"first last")
        after = await upload(api, auth, "u-a", "c-slots", "d.txt", b"d", "text/plain")
        assert after.status == 201  # the slot came back


async def _uploading(pool: asyncpg.Pool) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM attachments WHERE state = 'UPLOADING'"))
