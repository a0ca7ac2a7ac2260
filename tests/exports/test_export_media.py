"""Exports with media (docs/api.md: Submitting an export, Exports with media), run by the real
relay, worker and janitor on Postgres, RabbitMQ and the S3 emulator: the ZIP holds the file, every included
attachment under ``media/<id>/<safe name>`` and a manifest, opens with ``zipfile`` and ``unzip -t``, and says why
each file it left out is not in it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import subprocess
import zipfile
import zlib
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.support.api_calls import expect_problem, make_conversation, submit, succeeded
from tests.support.claims import claim
from tests.support.e2e import Browser
from tests.support.messages import Auth, Client, send_with, uploaded

pytestmark = pytest.mark.module_database

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
MEMBER = re.compile(r"media/att_[A-Za-z0-9_-]+/[^/\\]+")


async def zipped(
    api: Client, auth: Auth, cid: str, body: dict[str, Any], key: str, *, timeout: float = 60
) -> tuple[zipfile.ZipFile, bytes]:
    operation = await succeeded(api, auth, "alice", cid, {"media": True, **body}, key, timeout=timeout)
    assert operation["result"]["content_type"] == "application/zip"
    response = await api.get(operation["result"]["url"], headers=auth("alice"))
    assert response.status == 200
    content = await response.read()
    assert hashlib.sha256(content).hexdigest() == operation["result"]["sha256"]
    return zipfile.ZipFile(io.BytesIO(content)), content


def check_manifest(archive: zipfile.ZipFile) -> dict[str, Any]:
    """Every member the manifest lists has its size and sha256, and every member but the manifest is listed."""
    manifest: dict[str, Any] = json.loads(archive.read("manifest.json"))
    for listed in manifest["members"]:
        data = archive.read(listed["name"])
        assert (len(data), hashlib.sha256(data).hexdigest()) == (listed["size_bytes"], listed["sha256"])
    assert {listed["name"] for listed in manifest["members"]} == set(archive.namelist()) - {"manifest.json"}
    return manifest


def local_header(content: bytes, name: str) -> tuple[int, int, int, int, bytes]:
    """(flags, method, crc32, 32-bit sizes field, extra) of the local header of member ``name``."""
    encoded = name.encode()
    at = content.index(b"PK\x03\x04")
    while True:
        (flags, method, crc32, _compressed, size, name_length, extra_length) = struct.unpack(
            "<2xHH4xIIIHH", content[at + 4 : at + 30]
        )
        if content[at + 30 : at + 30 + name_length] == encoded:
            extra = content[at + 30 + name_length : at + 30 + name_length + extra_length]
            return flags, method, crc32, size, extra
        at = content.index(b"PK\x03\x04", at + 4)


async def test_a_zip_holds_the_file_the_media_it_may_and_says_why_not_the_rest(
    api: Client, auth: Auth, pipeline: None, tmp_path: Path
) -> None:
    await make_conversation(api, auth, "c-media", ["alice"])
    photo = await uploaded(api, auth, "alice", "c-media", "image.png", PNG, "image/png")
    other = await uploaded(api, auth, "alice", "c-media", "image.png", PNG[::-1], "image/png")
    big = await uploaded(api, auth, "alice", "c-media", "big.png", PNG * 8, "image/png")
    notes = await uploaded(api, auth, "alice", "c-media", "notes.txt", b"notes", "text/plain")
    gone = await uploaded(api, auth, "alice", "c-media", "gone.png", PNG, "image/png")
    ids = [photo["attachment_id"], other["attachment_id"], big["attachment_id"], notes["attachment_id"]]
    assert (await send_with(api, auth, "alice", "c-media", "m-1", ids)).status == 200
    # The same file again: stored once.
    assert (await send_with(api, auth, "alice", "c-media", "m-2", [photo["attachment_id"]])).status == 200
    assert (await send_with(api, auth, "alice", "c-media", "m-3", [gone["attachment_id"]])).status == 200
    await api.delete("/v2/conversations/c-media/messages/m-3", headers=auth("alice"))

    archive, content = await zipped(
        api, auth, "c-media", {"media_types": ["image/*"], "media_max_file_bytes": len(PNG) * 2}, "k-zip"
    )
    operation = await (await api.get("/v3/operations?limit=1", headers=auth("alice"))).json()
    estimate = operation["operations"][0]["estimate"]["bytes"]
    # The two files it includes, and about the messages' file: more than the files, far less than all four.
    assert 2 * len(PNG) < estimate < 2 * len(PNG) + 10 * 1024, estimate

    manifest = check_manifest(archive)
    media = sorted(name for name in archive.namelist() if name.startswith("media/"))
    assert media == sorted(f"media/{attachment['attachment_id']}/image.png" for attachment in (photo, other))
    assert archive.read(f"media/{photo['attachment_id']}/image.png") == PNG
    assert {(item["attachment_id"], item["reason"]) for item in manifest["left_out"]} == {
        (big["attachment_id"], "too_large"),
        (notes["attachment_id"], "type_excluded"),
    }
    assert gone["attachment_id"] not in content.decode("latin-1")  # the recalled message's file is nowhere
    lines = [json.loads(line) for line in archive.read("c-media.jsonl").splitlines()]
    assert [line["message_id"] for line in lines] == ["m-1", "m-2"]
    shown = {item["attachment_id"]: item for item in lines[0]["attachments"]}
    assert shown[photo["attachment_id"]]["path"] == f"media/{photo['attachment_id']}/image.png"
    assert shown[big["attachment_id"]]["left_out"] == "too_large" and "path" not in shown[big["attachment_id"]]
    assert shown[big["attachment_id"]]["size_bytes"] == len(PNG) * 8
    assert shown[notes["attachment_id"]]["left_out"] == "type_excluded"

    # Stored media: no recompression, size and CRC-32 in the local header, no data descriptor.
    flags, method, crc32, size, _ = local_header(content, f"media/{photo['attachment_id']}/image.png")
    assert (flags & 0x08, method, size) == (0, 0, len(PNG))
    assert crc32 == archive.getinfo(f"media/{photo['attachment_id']}/image.png").CRC != 0
    path = tmp_path / "export.zip"
    path.write_bytes(content)
    tested = subprocess.run(["unzip", "-t", str(path)], capture_output=True, text=True, check=False)
    assert tested.returncode == 0, tested.stdout + tested.stderr


async def test_hostile_file_names_stay_inside_their_folder(api: Client, auth: Auth, pipeline: None) -> None:
    await make_conversation(api, auth, "c-names", ["alice"])
    names = ["../../etc/passwd", "/abs/olute.png", "a\x01b\x7fc.txt", "..", "C:\\win\\x.exe", "\u202egnp.exe", "ok.png"]
    stored = [await uploaded(api, auth, "alice", "c-names", name, b"x", "application/octet-stream") for name in names]
    assert (
        await send_with(api, auth, "alice", "c-names", "m-1", [item["attachment_id"] for item in stored])
    ).status == 200

    archive, _ = await zipped(api, auth, "c-names", {}, "k-names")

    check_manifest(archive)
    media = [name for name in archive.namelist() if name.startswith("media/")]
    assert len(media) == len(names)
    for name in media:
        assert MEMBER.fullmatch(name), name
        assert ".." not in name.split("/") and not any(ord(char) < 0x20 or char in "\x7f\u202e" for char in name)
    assert f"media/{stored[-1]['attachment_id']}/ok.png" in media


async def test_media_options_need_media_and_refuse_what_a_zip_cannot_be(api: Client, auth: Auth, chat: str) -> None:
    refusals: list[dict[str, Any]] = [
        {"media_types": ["image/*"]},
        {"media": True, "compression": "gzip"},
        {"media": True, "media_types": ["image"]},
        {"media": "yes"},
    ]
    for number, body in enumerate(refusals):
        await expect_problem(
            await submit(api, auth, "u-a", chat, body, f"k-{number}"), 422, "VALIDATION_FAILED", case=body
        )


async def test_two_thousand_files_named_alike_are_two_thousand_members(
    api: Client, auth: Auth, pipeline: None, pool: asyncpg.Pool, s3: Any, settings: Any
) -> None:
    await make_conversation(api, auth, "c-many", ["alice"])
    first = await uploaded(api, auth, "alice", "c-many", "image.png", PNG, "image/png")
    # The other 1,999 as uploads leave them, written straight to the bucket and the table to keep the test short.
    row = await pool.fetchrow("SELECT * FROM attachments WHERE attachment_id = $1", first["attachment_id"])
    ids = [f"att_many{number:05d}" for number in range(1999)]
    for attachment_id in ids:
        await s3.put_object(Bucket=settings.s3_bucket, Key=f"{settings.s3_attachment_prefix}{attachment_id}", Body=PNG)
    await pool.executemany(
        "INSERT INTO attachments (attachment_id, conversation_id, uploader_id, file_name, content_type, object_key,"
        " state, size_bytes, sha256, crc32) VALUES ($1, 'c-many', 'alice', 'image.png', 'image/png', $2, 'STORED',"
        " $3, $4, $5)",
        [
            (
                attachment_id,
                f"{settings.s3_attachment_prefix}{attachment_id}",
                row["size_bytes"],
                row["sha256"],
                row["crc32"],
            )
            for attachment_id in ids
        ],
    )
    every = [first["attachment_id"], *ids]
    for number in range(0, len(every), 20):
        sent = await send_with(api, auth, "alice", "c-many", f"m-{number}", every[number : number + 20])
        assert sent.status == 200, await sent.text()

    # A deadline, not a speed check (bench/media.py measures that): the worker reads the 2,000 files from the
    # emulator one after another, which took over a minute beside the rest of the suite on a 2-core machine.
    archive, _ = await zipped(api, auth, "c-many", {}, "k-many", timeout=300)

    media = [name for name in archive.namelist() if name.startswith("media/")]
    assert len(media) == len(set(media)) == 2000
    assert {name.rsplit("/", 1)[1] for name in media} == {"image.png"}
    check_manifest(archive)


def png(width: int, height: int) -> bytes:
    """A valid RGB PNG of ``width`` x ``height`` red pixels (RFC 2083's chunks, built here)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


async def test_the_html_inside_shows_its_images_offline(
    api: Client, auth: Auth, pipeline: None, browser: Browser, tmp_path: Path
) -> None:
    await make_conversation(api, auth, "c-view", ["alice"])
    picture = await uploaded(api, auth, "alice", "c-view", "red dot #1.png", png(3, 2), "image/png")
    drawing = await uploaded(
        api, auth, "alice", "c-view", "d.svg", b'<svg xmlns="http://www.w3.org/2000/svg"/>', "image/svg+xml"
    )
    ids = [picture["attachment_id"], drawing["attachment_id"]]
    assert (await send_with(api, auth, "alice", "c-view", "m-1", ids)).status == 200

    archive, _ = await zipped(api, auth, "c-view", {"format": "html"}, "k-view")
    folder = tmp_path / "unzipped"
    archive.extractall(folder)
    page = folder / "c-view.html"
    browser.driver.get(page.as_uri())

    images = browser.driver.execute_script(
        "return [...document.images].map(image => [image.getAttribute('src'), image.naturalWidth, image.naturalHeight])"
    )
    assert images == [[f"media/{picture['attachment_id']}/red%20dot%20%231.png", 3, 2]]
    links = browser.driver.execute_script("return [...document.links].map(link => link.getAttribute('href'))")
    assert f"media/{drawing['attachment_id']}/d.svg" in links  # the SVG only as a link
    assert browser.driver.execute_script("return document.scripts.length") == 0
    requested = [
        message["params"]["request"]["url"]
        for entry in browser.driver.get_log("performance")
        if (message := json.loads(entry["message"])["message"])["method"] == "Network.requestWillBeSent"
    ]
    assert page.as_uri() in requested and len(requested) >= 2, requested  # the page and its image
    assert all(url.startswith(folder.as_uri() + "/") for url in requested), requested


async def test_a_file_the_bucket_lost_is_listed_unavailable(
    api: Client, auth: Auth, pipeline: None, s3: Any, settings: Any
) -> None:
    await make_conversation(api, auth, "c-lost", ["alice"])
    kept = await uploaded(api, auth, "alice", "c-lost", "kept.png", PNG, "image/png")
    lost = await uploaded(api, auth, "alice", "c-lost", "lost.png", PNG, "image/png")
    ids = [lost["attachment_id"], kept["attachment_id"]]
    assert (await send_with(api, auth, "alice", "c-lost", "m-1", ids)).status == 200
    await s3.delete_object(Bucket=settings.s3_bucket, Key=f"{settings.s3_attachment_prefix}{lost['attachment_id']}")

    archive, _ = await zipped(api, auth, "c-lost", {}, "k-lost")

    manifest = check_manifest(archive)
    assert [item["reason"] for item in manifest["left_out"]] == ["unavailable"]
    (line,) = [json.loads(line) for line in archive.read("c-lost.jsonl").splitlines()]
    assert [item.get("left_out") for item in line["attachments"]] == ["unavailable", None]
    assert archive.read(f"media/{kept['attachment_id']}/kept.png") == PNG


async def test_the_previous_release_claim_passes_over_an_export_with_media(
    api: Client, auth: Auth, chat: str, pool: asyncpg.Pool
) -> None:
    media = await (await submit(api, auth, "u-a", chat, {"media": True}, "k-media")).json()
    plain = await (await submit(api, auth, "u-a", chat, {}, "k-plain")).json()
    # The function the previous release's workers call (migration 0017), passing over what they cannot write.
    previous = "SELECT (claimed).operation_id FROM claim_export($1, 'old-worker', 60, 5, 'lost')"
    async with pool.acquire() as conn:
        assert await conn.fetchval(previous, media["operation_id"]) is None
        assert await conn.fetchval(previous, plain["operation_id"]) == plain["operation_id"]
        claimed = await claim(conn, media["operation_id"], "new-worker", lease_seconds=60)
    assert claimed.request.media


async def test_a_split_export_with_media_is_self_contained_zips_under_the_split_size(
    api: Client, auth: Auth, pipeline: None
) -> None:
    mib = 1024 * 1024
    await make_conversation(api, auth, "c-split", ["alice"])
    files = [await uploaded(api, auth, "alice", "c-split", f"f{n}.bin", os.urandom(mib), "a/b") for n in range(12)]
    huge = await uploaded(api, auth, "alice", "c-split", "huge.bin", os.urandom(5 * mib), "a/b")
    for number, item in enumerate(files):
        sent = await send_with(api, auth, "alice", "c-split", f"m-{number}", [item["attachment_id"]])
        assert sent.status == 200
    # The first file again, later: each part that holds a message carrying it holds the file.
    assert (await send_with(api, auth, "alice", "c-split", "m-again", [files[0]["attachment_id"]])).status == 200
    assert (await send_with(api, auth, "alice", "c-split", "m-huge", [huge["attachment_id"]])).status == 200

    operation = await succeeded(api, auth, "alice", "c-split", {"media": True, "max_part_bytes": 5 * mib}, "k-split")

    parts = operation["result"]["parts"]
    assert len(parts) >= 3
    seen_messages, left_out = [], {}
    for part in parts:
        response = await api.get(part["url"], headers=auth("alice"))
        content = await response.read()
        assert len(content) == part["size_bytes"] <= 5 * mib
        assert hashlib.sha256(content).hexdigest() == part["sha256"]
        archive = zipfile.ZipFile(io.BytesIO(content))
        manifest = check_manifest(archive)
        lines = [json.loads(line) for line in archive.read("c-split.jsonl").splitlines()]
        assert len(lines) == part["message_count"]
        for line in lines:
            for item in line["attachments"]:
                if "path" in item:
                    assert item["path"] in archive.namelist()  # self-contained: its files are in it
        seen_messages += [line["message_id"] for line in lines]
        left_out.update({item["attachment_id"]: item["reason"] for item in manifest["left_out"]})
    assert seen_messages == [f"m-{n}" for n in range(12)] + ["m-again", "m-huge"]
    assert left_out == {huge["attachment_id"]: "too_large"}  # larger than any part can hold
