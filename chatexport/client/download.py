"""Downloading a result into files: each file into ``FILE.part`` first, resumed with a ``Range`` guarded by
``If-Range`` (so a changed file is never spliced onto an old part), checked against the size and sha256
the status gives, then renamed into place atomically. A split result is one such file per part, named
``OUTPUT`` with ``.part-<n>`` before its extension (docs/command-line.md: Command-line client).

A file above the session's ``redirect_above_bytes`` comes from the storage itself: the API answers each
fetch, a resume too, with a ``303`` to a fresh short-lived URL, which is fetched without the token (the URL
is the credential, and S3 refuses a request that carries both), a resumed range guarded by the storage's
own ETag (``If-Match``, kept beside the part file); the end checks are the same (docs/api.md: Downloads,
Download by redirect).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url

from chatexport.client.api import Api, problem_of

CHUNK_BYTES = 256 * 1024


# The backoff before a failed storage connection is tried again: doubled each time, at most the maximum (seconds).
STORAGE_BACKOFF_SECONDS = 0.5
STORAGE_BACKOFF_MAX_SECONDS = 8.0


class StorageRefused(Exception):
    """The storage refused a redirected download's URL even when asked again with a fresh one."""


class StorageUnavailable(Exception):
    """The storage's connection failed on every try of a redirected download; the part file keeps what came."""


class NotVerified(Exception):
    """The downloaded bytes are not the file the status describes; the part file was deleted."""


@dataclass(frozen=True)
class Downloaded:
    """A file written and verified: where it is, and the status's figures for it."""

    path: Path
    message_count: int
    size_bytes: int
    sha256: str


def extension_of(request: dict[str, Any]) -> str:
    """The extension of a result of ``request`` (a submit body, or an operation's ``request``): its ``format``
    (jsonl when absent), as the API names a file after its format (docs/api.md: Submitting an export, Export options),
    then ``.gz`` when its ``compression`` is gzip: ``.csv``, ``.html.gz``; ``.zip`` for an export with media.
    Which formats exist, the API says.
    """
    if request.get("media"):
        return ".zip"
    compressed = request.get("compression") == "gzip"
    return f".{request.get('format', 'jsonl')}" + (".gz" if compressed else "")


def result_part_path(destination: Path, number: int, extension: str) -> Path:
    """Where part ``number`` of a split result meant for ``destination`` goes: ``.part-<number>`` inserted
    before ``extension`` (such as ``.csv.gz``) when the name ends with it, else before the name's last
    suffix: ``c1.csv.gz`` gives ``c1.part-1.csv.gz``, ``out.txt`` gives ``out.part-1.txt``, ``out`` gives
    ``out.part-1``.
    """
    name = destination.name
    if not (len(name) > len(extension) and name.endswith(extension)):
        extension = destination.suffix
    return destination.with_name(f"{name[: len(name) - len(extension)]}.part-{number}{extension}")


def part_path(destination: Path) -> Path:
    """Where the download of ``destination`` grows until it is verified."""
    return destination.with_name(destination.name + ".part")


async def download_result(api: Api, operation: dict[str, Any], destination: Path) -> list[Downloaded]:
    """Download the result of the SUCCEEDED ``operation``: one file to ``destination``, or each part of a
    split result beside it (``result_part_path``), resuming part files left by an earlier run. Returns the
    files in order. Raises ``ApiError`` when the API refuses, ``aiohttp.ClientError`` when the connection
    fails (part files stay for the next run), ``NotVerified``, and ``OSError`` for the local files.
    """
    extension = extension_of(operation["request"])
    files = result_files(operation, destination, lambda number: result_part_path(destination, number, extension))
    return [await download_file(api, file, path) for file, path in files]


def result_files(
    operation: dict[str, Any], destination: Path, part_destination: Callable[[int], Path]
) -> list[tuple[dict[str, Any], Path]]:
    """Each file of the SUCCEEDED ``operation``'s result (its ``result`` or one of its ``parts``) with the
    path it goes to, in order: ``destination`` for one file, ``part_destination(number)`` for each part of a
    split result.
    """
    result = operation["result"]
    parts = result.get("parts")
    if parts is None:
        return [(result, destination)]
    return [(part, part_destination(int(part["number"]))) for part in parts]


async def fetch_verified(api: Api, file: dict[str, Any], destination: Path) -> Path:
    """Download ``file`` (a result or one of its parts: ``url``, ``size_bytes``, ``sha256``) into the part
    file of ``destination``, resuming what an earlier run left there, and check it; return the part file.
    Raises like ``download_result``.
    """
    part = part_path(destination)
    have = _length(part)
    # An empty file is fetched too: the fetch creates its part file.
    if have is None or have < file["size_bytes"]:
        await _fetch(api, file, part, have or 0)
    size, sha256 = _digest(part)
    _tag_path(part).unlink(missing_ok=True)
    if (size, sha256) != (file["size_bytes"], file["sha256"]):
        part.unlink()
        raise NotVerified(
            f"the download of {destination} has {size} bytes with sha256 {sha256}, but the status says "
            f"{file['size_bytes']} bytes with sha256 {file['sha256']}; the part file was deleted, run the "
            "command again"
        )
    if destination.suffix == ".zip":
        problem = zip_problem(part)
        if problem is not None:
            part.unlink()
            raise NotVerified(f"the download of {destination} is not the ZIP its manifest describes: {problem}")
    return part


def zip_problem(path: Path) -> str | None:
    """What is wrong with the ZIP of an export with media at ``path``, or None: every member must read back
    with its CRC-32, and every member ``manifest.json`` lists must have its size and SHA-256 (docs/api.md:
    Submitting an export, Exports with media).
    """
    try:
        with zipfile.ZipFile(path) as archive:
            for listed in json.loads(archive.read("manifest.json"))["members"]:
                digest, size = hashlib.sha256(), 0
                with archive.open(listed["name"]) as member:
                    while chunk := member.read(1024 * 1024):
                        digest.update(chunk)
                        size += len(chunk)
                if (size, digest.hexdigest()) != (listed["size_bytes"], listed["sha256"]):
                    return f"{listed['name']} differs from the manifest"
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


async def download_file(api: Api, file: dict[str, Any], destination: Path) -> Downloaded:
    """Download ``file`` (a result or one of its parts) to ``destination`` through its part file
    (``fetch_verified``) and rename it into place. Raises like ``download_result``.
    """
    # A rerun after a crash finds the files it had already put in place: they are checked, not fetched again.
    if not _holds(destination, file):
        os.replace(await fetch_verified(api, file, destination), destination)
    return Downloaded(destination, file["message_count"], file["size_bytes"], file["sha256"])


async def _fetch(api: Api, file: dict[str, Any], part: Path, have: int) -> None:
    redirect_above = api.redirect_above_bytes
    if redirect_above is not None and file["size_bytes"] > redirect_above:
        await _fetch_by_redirect(api, file, part, have)
        return
    headers = {"Range": f"bytes={have}-", "If-Range": f'"{file["sha256"]}"'} if have else {}
    async with api.session.get(api.url(file["url"]), headers=headers) as response:
        await _write(response, part)


async def _fetch_by_redirect(api: Api, file: dict[str, Any], part: Path, have: int) -> None:
    """Ask the API for the file's storage URL and fetch it from there. A URL the storage refuses (expired:
    403) or a part file the stored object no longer continues (412) gets one more try with a fresh URL,
    the latter from the start. A storage connection that fails (refused, cut in the middle of the body, silent)
    is tried again up to ``api.storage_retries`` times, after a backoff, with a fresh URL and from where the
    part file ends; then ``StorageUnavailable`` is raised.
    """
    refusals = failures = 0
    while True:
        headers = {"Range": f"bytes={have}-", "If-Range": f'"{file["sha256"]}"'} if have else {}
        url = api.url(file["url"]) + "?delivery=redirect"
        async with api.session.get(url, headers=headers, allow_redirects=False) as response:
            if response.status != 303:
                await _write(response, part)  # an API without redirects streams the file
                return
            location = response.headers["Location"]
        try:
            status = await _fetch_from_storage(api, location, part, have, last_try=refusals > 0)
        except (aiohttp.ClientError, TimeoutError) as exc:
            failures += 1
            if failures > api.storage_retries:
                host = aiohttp.client.URL(location).host
                raise StorageUnavailable(
                    f"the storage at {host} failed {failures} times in a row ({type(exc).__name__})"
                ) from exc
            await asyncio.sleep(min(STORAGE_BACKOFF_SECONDS * 2 ** (failures - 1), STORAGE_BACKOFF_MAX_SECONDS))
            have = _length(part) or 0
            continue
        if status not in (403, 412):
            return
        refusals += 1
        if status == 412:
            _start_over(part)
            have = 0


async def _fetch_from_storage(api: Api, url: str, part: Path, have: int, *, last_try: bool) -> int:
    """Fetch ``url``, a presigned storage URL, into ``part`` (``have`` bytes of it already there) with no
    credentials of any kind (``Api.storage_session``), a resume guarded by the ETag the storage gave the
    part's start. Returns the storage's status; a 403 or 412 writes nothing, and raises ``StorageRefused`` on
    the ``last_try``. Raises what aiohttp raises when the connection fails; the bytes read until then stay in
    ``part``.
    """
    tag = _storage_tag(part) if have else None
    headers = {"Range": f"bytes={have}-", "If-Match": tag} if tag else {}
    async with api.storage_session.get(
        url, headers=headers, allow_redirects=False, proxy=storage_proxy(url)
    ) as response:
        if response.status in (403, 412) and not last_try:
            return response.status
        if response.status not in (200, 206):
            raise StorageRefused(f"the storage refused the download: HTTP {response.status} {response.reason}")
        if response.headers.get("ETag"):
            _tag_path(part).write_text(response.headers["ETag"], encoding="ascii")
        await _write(response, part)
        return response.status


def storage_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``), without
    the credentials it may hold: those are the proxy's, never sent on a request to the storage. None when the
    environment names none.
    """
    try:
        proxy, _credentials = get_env_proxy_for_url(aiohttp.client.URL(url))
    except LookupError:
        return None
    return str(proxy.with_user(None))


def _storage_tag(part: Path) -> str | None:
    """The storage's ETag of the download that ``part`` holds the start of, if it was kept."""
    path = _tag_path(part)
    return path.read_text(encoding="ascii").strip() if path.exists() else None


def _start_over(part: Path) -> None:
    """Forget ``part`` and its storage ETag: the stored object is not the one the part began with."""
    _tag_path(part).unlink(missing_ok=True)
    part.unlink(missing_ok=True)


async def _write(response: aiohttp.ClientResponse, part: Path) -> None:
    """Write the body of a 200 (the whole file) or 206 (the rest of ``part``) into ``part``; raises
    ``ApiError`` for any other answer.
    """
    if response.status not in (200, 206):
        raise await problem_of(response)
    # 200 despite a Range: the file is not the one the part began, so the part starts over.
    with part.open("ab" if response.status == 206 else "wb") as target:
        async for chunk in response.content.iter_chunked(CHUNK_BYTES):
            target.write(chunk)
        target.flush()
        os.fsync(target.fileno())


def _tag_path(part: Path) -> Path:
    """Where the storage's ETag of a redirected download's ``part`` file is kept until it is verified."""
    return part.with_name(part.name + ".etag")


def _holds(path: Path, file: dict[str, Any]) -> bool:
    """True when ``path`` is already the file ``file`` describes (its size and sha256)."""
    return path.is_file() and _digest(path) == (file["size_bytes"], file["sha256"])


def _length(path: Path) -> int | None:
    """The size of the file at ``path`` in bytes; None when there is none."""
    return path.stat().st_size if path.exists() else None


def _digest(path: Path) -> tuple[int, str]:
    """The size in bytes and the hex sha256 of the file at ``path``."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    return path.stat().st_size, digest.hexdigest()
