"""Downloading a result into a file: into ``FILE.part`` first, resumed with a ``Range`` guarded by
``If-Range`` (so a changed file is never spliced onto an old part), checked against the size and sha256
the status gives, then renamed into place atomically (README: Command-line client).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from chatexport.client.api import Api, problem_of

CHUNK_BYTES = 256 * 1024


class NotVerified(Exception):
    """The downloaded bytes are not the file the status describes; the part file was deleted."""


def part_path(destination: Path) -> Path:
    """Where the download of ``destination`` grows until it is verified."""
    return destination.with_name(destination.name + ".part")


async def download_result(api: Api, operation: dict[str, Any], destination: Path) -> None:
    """Download the result of the SUCCEEDED ``operation`` to ``destination``, resuming a part file left by
    an earlier run. Raises ``ApiError`` when the API refuses, ``aiohttp.ClientError`` when the connection
    fails (the part file stays for the next run), and ``NotVerified``.
    """
    result = operation["result"]
    part = part_path(destination)
    have = part.stat().st_size if part.exists() else 0
    if have < result["size_bytes"]:
        await _fetch(api, result, part, have)
    _verify(part, size=result["size_bytes"], sha256=result["sha256"])
    os.replace(part, destination)


async def _fetch(api: Api, result: dict[str, Any], part: Path, have: int) -> None:
    headers = {"Range": f"bytes={have}-", "If-Range": f'"{result["sha256"]}"'} if have else {}
    async with api.session.get(api.url(result["url"]), headers={**api.auth_headers, **headers}) as response:
        if response.status not in (200, 206):
            raise await problem_of(response)
        # 200 despite a Range: the file is not the one the part began, so the part starts over.
        with part.open("ab" if response.status == 206 else "wb") as file:
            async for chunk in response.content.iter_chunked(CHUNK_BYTES):
                file.write(chunk)
            file.flush()
            os.fsync(file.fileno())


def _verify(part: Path, *, size: int, sha256: str) -> None:
    digest = hashlib.sha256()
    with part.open("rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    actual_size = part.stat().st_size
    if actual_size != size or digest.hexdigest() != sha256:
        part.unlink()
        raise NotVerified(
            f"the download has {actual_size} bytes with sha256 {digest.hexdigest()}, but the status says "
            f"{size} bytes with sha256 {sha256}; the part file was deleted, run the command again"
        )
