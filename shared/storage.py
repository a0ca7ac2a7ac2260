"""S3 access: the client factory, the bucket, artifact keys (docs/architecture.md: How it works), and resumable
listings."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Final, Generic, TypeVar

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import BotoCoreError, ClientError, ReadTimeoutError

from shared.export.formats import COMPRESSIONS, FORMAT_NAMES, FileKind
from shared.settings import StorageSettings

# What an unreachable, failing or misconfigured S3 raises.
STORAGE_ERRORS: tuple[type[BaseException], ...] = (BotoCoreError, ClientError)
# Pooled S3 connections beyond what a part's own work holds at once, for verification, deletes and the rest.
S3_SPARE_CONNECTIONS = 16
# The most entries one listing page or one DeleteObjects request holds (S3 API limit).
S3_BATCH_MAX = 1000
# An upload slower than this counts as stalled (see ``upload_deadline``).
MIN_UPLOAD_BYTES_PER_SECOND = 256 * 1024


def artifact_prefix(settings: StorageSettings, operation_id: str) -> str:
    """Every object of one operation lives under ``<s3_prefix><operation_id>/``."""
    return f"{settings.s3_prefix}{operation_id}/"


def artifact_key(settings: StorageSettings, operation_id: str, generation: int, *, extension: str, split: bool) -> str:
    """The key of one attempt's artifact, derived from (operation, fencing generation): the object
    ``<op>/g<gen>.<extension>``, or for a split result the folder ``<op>/g<gen>/`` of its parts (``part_key``).
    The claim that records it builds the same key in SQL from ``artifact_key_stem`` and ``ARTIFACT_KEY_SUFFIXES``.
    """
    return f"{artifact_key_stem(settings, operation_id)}{generation}{_artifact_key_suffix(extension, split=split)}"


def artifact_key_stem(settings: StorageSettings, operation_id: str) -> str:
    """What every artifact key of the operation starts with, the generation following it: ``<op>/g``."""
    return f"{artifact_prefix(settings, operation_id)}g"


def _artifact_key_suffix(extension: str, *, split: bool) -> str:
    return "/" if split else f".{extension}"


# The suffix of a file's artifact key after its generation, by "<format>/<compression>/<media 0 or 1>", as JSON:
# the claim that records an attempt's artifact (``leases.claim_export``) looks its key up here.
ARTIFACT_KEY_SUFFIXES: Final = json.dumps(
    {
        f"{name}/{compression}/{int(media)}": _artifact_key_suffix(
            FileKind(name, compression, zipped=media).extension, split=False
        )
        for name in FORMAT_NAMES
        for compression in COMPRESSIONS
        for media in (False, True)
    }
)


# A chunk's object is a piece of a file, served by nobody: its name says so whatever the format.
CHUNK_EXTENSION = "part"


def chunk_key_stem(settings: StorageSettings, operation_id: str, chunk_no: int) -> str:
    """The start of the keys of chunk ``chunk_no``'s objects (docs/chunks.md: Chunked exports): generation
    ``g`` of the chunk writes ``<op>/chunks/<chunk_no>-g<g>.part``.
    """
    return f"{artifact_prefix(settings, operation_id)}chunks/{chunk_no}-g"


def part_key(folder: str, number: int, *, extension: str) -> str:
    """The key of part ``number`` (1-based) of a split artifact whose key is ``folder``."""
    return f"{folder}part-{number}.{extension}"


def attachment_key(settings: StorageSettings, attachment_id: str) -> str:
    """An attachment's object: ``<s3_attachment_prefix><attachment id>`` (docs/api.md: Message store, Attachments)."""
    return f"{settings.s3_attachment_prefix}{attachment_id}"


def is_folder(key: str) -> bool:
    """True for a split artifact's key, the folder of its parts."""
    return key.endswith("/")


@contextlib.asynccontextmanager
async def open_s3_client(settings: StorageSettings, *, held: int = 0) -> AsyncIterator[Any]:
    """Yield an aiobotocore S3 client with timeouts and a pool of ``held`` connections (what the caller's
    own work holds at once: the API's downloads, the worker's exports and chunks) plus
    ``S3_SPARE_CONNECTIONS`` for everything else; closed on exit.
    """
    config = AioConfig(
        connect_timeout=settings.s3_timeout_seconds,
        read_timeout=settings.s3_timeout_seconds,
        max_pool_connections=held + S3_SPARE_CONNECTIONS,
        retries={"max_attempts": 2, "mode": "standard"},
        s3={"addressing_style": "path"},
    )
    async with _client(settings, endpoint_url=settings.s3_endpoint_url, config=config) as client:
        yield client


@contextlib.asynccontextmanager
async def open_presigner(settings: StorageSettings) -> AsyncIterator[Any]:
    """Yield an aiobotocore S3 client that signs URLs for ``s3_public_endpoint_url`` (else ``s3_endpoint_url``)
    with Signature Version 4 (so that a URL carries its ``X-Amz-Expires``); it never opens a connection.
    """
    # botocore logs every signature it makes at DEBUG; a presigned URL's is a credential, so its signer
    # logs nothing below INFO whatever the level asked for (docs/api.md: Downloads, Download by redirect).
    logging.getLogger("botocore.auth").setLevel(logging.INFO)
    config = AioConfig(signature_version="s3v4", s3={"addressing_style": "path"})
    endpoint_url = settings.s3_public_endpoint_url or settings.s3_endpoint_url
    async with _client(settings, endpoint_url=endpoint_url, config=config) as client:
        yield client


@functools.cache
def _session() -> AioSession:
    """The process's one aiobotocore session: a client's creation loads S3's service model and endpoint
    rules (about 0.2 s of CPU), and a session keeps what it loaded for every later client.
    """
    return get_session()


def _client(settings: StorageSettings, *, endpoint_url: str | None, config: AioConfig) -> Any:
    """The context manager of an S3 client for ``endpoint_url`` with the credentials of ``settings``."""
    return _session().create_client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=settings.s3_region,
        aws_access_key_id=settings.s3_access_key_id,
        aws_secret_access_key=settings.s3_secret_access_key,
        config=config,
    )


async def presigned_download(
    presigner: Any, *, bucket: str, key: str, expires_seconds: int, content_type: str, content_disposition: str
) -> str:
    """A URL that GETs object ``key`` of ``bucket`` for ``expires_seconds`` without credentials, its answer's
    ``Content-Type``, ``Content-Disposition`` and ``Cache-Control: no-store`` forced by the signed query
    (docs/api.md: Downloads, Download by redirect). The URL is a credential: never log it.
    """
    url: str = await presigner.generate_presigned_url(
        "get_object",
        Params={
            "Bucket": bucket,
            "Key": key,
            "ResponseContentType": content_type,
            "ResponseContentDisposition": content_disposition,
            "ResponseCacheControl": "no-store",
        },
        ExpiresIn=expires_seconds,
    )
    return url


@contextlib.asynccontextmanager
async def upload_deadline(*, timeout_seconds: float, size_bytes: int) -> AsyncIterator[None]:
    """Bound one upload request of ``size_bytes`` to ``timeout_seconds`` plus the time it takes at
    ``MIN_UPLOAD_BYTES_PER_SECOND``; past it, raise botocore's ``ReadTimeoutError`` (a storage error).

    The client's read timeout starts only once the request body is sent, so a server that accepts the
    connection and then stops reading (frozen, or a black-holed route) would hold the upload, and the
    export whose heartbeats keep its lease, for ever.
    """
    try:
        async with asyncio.timeout(timeout_seconds + size_bytes / MIN_UPLOAD_BYTES_PER_SECOND):
            yield
    except TimeoutError:
        raise ReadTimeoutError(endpoint_url="the upload stalled") from None


def is_missing(exc: ClientError) -> bool:
    """True when ``exc`` is S3 saying it holds no object under the key: ``NoSuchKey`` from a GET, ``404`` or
    ``NotFound`` from a HEAD, which has no body to name the error in."""
    return exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound")


async def abort_upload(s3: Any, *, bucket: str, key: str, upload_id: str) -> None:
    """Abort one multipart upload of ``key``; one already aborted or completed is no error."""
    with contextlib.suppress(s3.exceptions.NoSuchUpload):
        await s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)


async def ensure_bucket(client: Any, bucket: str) -> None:
    """Create ``bucket`` when it does not exist yet; an existing bucket is left alone."""
    try:
        await client.head_bucket(Bucket=bucket)
    except ClientError:
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            await client.create_bucket(Bucket=bucket)


async def delete_keys(s3: Any, *, bucket: str, keys: list[str]) -> list[str]:
    """Delete ``keys`` (at most ``S3_BATCH_MAX``) with one DeleteObjects request; return the keys S3 reports
    deleted (a key already gone counts, as S3 has it). A key S3 could not delete is left out. When S3
    refuses the request itself, each key is deleted on its own; an unreachable or throttling (503) S3
    raises ``STORAGE_ERRORS``.
    """
    if not keys:
        return []
    try:
        response = await s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": key} for key in keys]})
    except ClientError as exc:
        if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 503:
            raise  # S3 asks for less: one request per key would be more
        # A key the batch's XML cannot carry (a control character, say) fails the whole request; one by
        # one, it fails alone instead of keeping every other orphan in place.
        return [key for key in keys if await _delete_one(s3, bucket=bucket, key=key)]
    return [item["Key"] for item in response.get("Deleted", [])]


async def _delete_one(s3: Any, *, bucket: str, key: str) -> bool:
    try:
        await s3.delete_object(Bucket=bucket, Key=key)
    except ClientError:
        return False
    return True


@dataclass(frozen=True)
class ListedObject:
    """An object from a listing: its ``key`` and ``age_seconds`` since its LastModified."""

    key: str
    age_seconds: float


@dataclass(frozen=True)
class ListedUpload:
    """An open multipart upload from a listing: ``key``, ``upload_id`` and ``age_seconds`` since Initiated."""

    key: str
    upload_id: str
    age_seconds: float


Entry = TypeVar("Entry", ListedObject, ListedUpload)


class Pages(ABC, Generic[Entry]):
    """A listing under ``prefix`` of ``bucket``, one page per ``next_page`` call, each page resuming after
    the last entry of the page before; after the last page the walk starts over. Keeping the place across
    calls lets a caller bounded per round (a janitor pass) still reach every entry in turn.

    Ages are measured by S3's own clock (the response's ``Date`` header minus the entry's time), so the
    caller's clock may be off without making anything look older than it is.
    """

    def __init__(self, s3: Any, *, bucket: str, prefix: str) -> None:
        self._s3 = s3
        self._bucket = bucket
        self._prefix = prefix
        self._resume: dict[str, str] = {}

    async def next_page(self, limit: int) -> tuple[list[Entry], bool]:
        """Up to ``limit`` entries (at most ``S3_BATCH_MAX``; S3 may return fewer), in S3's order, and
        whether more follow. Raises ``STORAGE_ERRORS``, keeping the place.
        """
        response = await self._list(min(limit, S3_BATCH_MAX), self._resume)
        entries = self._entries(response, _server_time(response))
        more = bool(response.get("IsTruncated")) and bool(entries)
        self._resume = self._resume_after(entries[-1]) if more else {}
        return entries, more

    @abstractmethod
    async def _list(self, limit: int, resume: dict[str, str]) -> dict[str, Any]:
        """One page of S3's answer: at most ``limit`` entries, from the place ``resume`` names."""

    @abstractmethod
    def _entries(self, response: dict[str, Any], now: datetime) -> list[Entry]:
        """The entries of ``response``, aged by ``now``."""

    @abstractmethod
    def _resume_after(self, last: Entry) -> dict[str, str]:
        """The request parameters that resume the listing after ``last``."""


class ObjectPages(Pages[ListedObject]):
    """The objects under a prefix, page by page (ListObjectsV2), in key order."""

    async def _list(self, limit: int, resume: dict[str, str]) -> dict[str, Any]:
        response: dict[str, Any] = await self._s3.list_objects_v2(
            Bucket=self._bucket, Prefix=self._prefix, MaxKeys=limit, **resume
        )
        return response

    def _entries(self, response: dict[str, Any], now: datetime) -> list[ListedObject]:
        return [ListedObject(item["Key"], _age(now, item["LastModified"])) for item in response.get("Contents", [])]

    def _resume_after(self, last: ListedObject) -> dict[str, str]:
        return {"StartAfter": last.key}


class UploadPages(Pages[ListedUpload]):
    """The open multipart uploads under a prefix, page by page (ListMultipartUploads), by key then id."""

    async def _list(self, limit: int, resume: dict[str, str]) -> dict[str, Any]:
        response: dict[str, Any] = await self._s3.list_multipart_uploads(
            Bucket=self._bucket, Prefix=self._prefix, MaxUploads=limit, **resume
        )
        return response

    def _entries(self, response: dict[str, Any], now: datetime) -> list[ListedUpload]:
        return [
            ListedUpload(item["Key"], item["UploadId"], _age(now, item["Initiated"]))
            for item in response.get("Uploads", [])
        ]

    def _resume_after(self, last: ListedUpload) -> dict[str, str]:
        return {"KeyMarker": last.key, "UploadIdMarker": last.upload_id}


async def every_entry(pages: Pages[Entry]) -> list[Entry]:
    """Every entry of a fresh listing ``pages``, walked once to its end (for a small prefix: one artifact's
    parts). Raises ``STORAGE_ERRORS``.
    """
    entries: list[Entry] = []
    while True:
        page, more = await pages.next_page(S3_BATCH_MAX)
        entries += page
        if not more:
            return entries


def _server_time(response: dict[str, Any]) -> datetime:
    """S3's clock when it answered (the HTTP ``Date`` header, which every S3 sends); ours if it is absent."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    return parsedate_to_datetime(date) if date else datetime.now(UTC)


def _age(now: datetime, then: datetime) -> float:
    return (now - then).total_seconds()
