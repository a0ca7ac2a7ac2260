"""Export submission and result download: ``/v3/conversations/{cid}/exports``, ``/v3/exports/{id}/result``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from typing import Any

import aiohttp
import asyncpg
from aiohttp import hdrs, web
from botocore.exceptions import BotoCoreError, ClientError

from services.api.exporting.outcomes import EXPORT
from services.api.exporting.results import DOWNLOAD_SAFETY, ResultFile, content_disposition, result_file
from services.api.exporting.submission import FIRST_POLL_AFTER_SECONDS, submit
from services.api.exporting.transfer import TransferCut, stream
from services.api.http.bodies import JSON_BODY_PROBLEMS, read_model, validate_query
from services.api.http.contract import (
    LOCATION_HEADER,
    NO_STORE_HEADER,
    Answer,
    Body,
    Endpoint,
    header,
    header_parameter,
    retry_after,
)
from services.api.http.fields import sole_field
from services.api.http.idempotency import HEADER, KEY_PROBLEMS, parse_idempotency_key
from services.api.http.keys import (
    DOWNLOAD_SLOTS,
    POLICIES,
    POOL,
    PRESIGNER,
    PRINCIPAL,
    RATE_LIMITS,
    SETTINGS,
    s3_client,
)
from services.api.http.metrics import DOWNLOADS, DOWNLOADS_STREAMING
from services.api.http.preconditions import PreconditionOutcome, Validators
from services.api.http.problems import ProblemError, not_found
from services.api.http.ranges import ByteRange, RangeNotSatisfiable, parse_range
from services.api.http.responses import NO_STORE, operation_answer, operation_response
from services.api.http.schemas import DownloadQuery, EmptyQuery, ExportSubmission
from services.api.limiting.policies import is_exempt
from shared.db import TRANSIENT_DATABASE_ERRORS
from shared.export.formats import FORMATS, GZIP_CONTENT_TYPE
from shared.ids import is_operation_id
from shared.metrics import AUTHORIZATION_REFUSALS
from shared.repository import status_monitor
from shared.repository.access_events import record_access_event
from shared.repository.message_store import is_member
from shared.repository.operation_view import OperationView
from shared.routes import path
from shared.settings import ApiPartSettings
from shared.states import State
from shared.storage import STORAGE_ERRORS, presigned_download
from shared.webhooks.targets import RefusedTarget, check_url

log = logging.getLogger(__name__)

# What reading an object's body from S3 can raise once its first bytes came: botocore's errors, and the
# HTTP client's for a connection cut or timed out mid-body (aiohttp.ClientPayloadError among them).
STORAGE_READ_ERRORS: tuple[type[BaseException], ...] = (
    *STORAGE_ERRORS,
    aiohttp.ClientError,
    TimeoutError,
    ConnectionError,
)

DOWNLOAD_CHUNK_BYTES = 256 * 1024


async def submit_export(request: web.Request) -> web.Response:
    """``POST /v3/conversations/{cid}/exports``: checks in the documented order (docs/api.md: Submitting an export,
    Submit), then 202.
    """
    validate_query(EmptyQuery, request)
    settings = request.app[SETTINGS]
    principal = request[PRINCIPAL]
    key = parse_idempotency_key(request.headers)
    body = await read_model(request, ExportSubmission, max_bytes=settings.export_request_max_bytes)
    conversation_id = request.match_info["cid"]
    notify_url = None if body.notify is None else checked_notify_url(body.notify.url, settings)
    export = body.export_request(notify_url=notify_url)
    async with request.app[POOL].acquire() as conn:
        submitted = await submit(
            conn,
            settings,
            owner_id=principal.user_id,
            conversation_id=conversation_id,
            idempotency_key=key,
            request=export,
            policies=None if is_exempt(principal, settings) else request.app[POLICIES],
        )
    request[RATE_LIMITS] = submitted.limits
    row = submitted.operation
    headers = {"Location": path("getOperation", operation_id=row.operation_id)}
    if submitted.replayed:
        headers["Idempotent-Replayed"] = "true"
    return operation_response(row, status=202, poll_after_seconds=FIRST_POLL_AFTER_SECONDS, **headers)


# Download refusals (docs/api.md: Downloads, Download), by state, in the order they are checked.
_STATE_REFUSALS: dict[str, tuple[str, str]] = {
    State.EXPIRED: ("RESULT_EXPIRED", "The result's retention has ended and the file was deleted."),
    State.CANCELED: ("RESULT_NOT_AVAILABLE", "The export was canceled; it has no result."),
    State.FAILED: ("RESULT_NOT_AVAILABLE", "The export failed; it has no result."),
    State.FAILED_REPAIR: ("RESULT_NOT_AVAILABLE", "The export needs an operator; it has no result."),
}


def checked_notify_url(url: str, settings: ApiPartSettings) -> str:
    """``url`` once it may receive callbacks; else 422 ``NOTIFY_URL_REFUSED`` saying why, never quoting it."""
    try:
        return check_url(url, allow_private=settings.webhook_allow_private).url
    except RefusedTarget as refusal:
        raise ProblemError(
            "NOTIFY_URL_REFUSED",
            f"notify.url cannot receive callbacks: {refusal}.",
            errors=[{"loc": ["body", "notify", "url"], "msg": str(refusal)}],
        ) from None


async def download_result(request: web.Request) -> web.StreamResponse:
    """``GET /v3/exports/{id}/result``: the file of a result that is not split (docs/api.md: Downloads,
    Download)."""
    return await _download(request, part_number=None)


async def download_part(request: web.Request) -> web.StreamResponse:
    """``GET /v3/exports/{id}/result/parts/{number}``: one part of a split result, by the same rules as
    ``download_result`` (docs/api.md: Submitting an export, Export options).
    """
    return await _download(request, part_number=request.match_info["number"])


async def _download(request: web.Request, *, part_number: str | None) -> web.StreamResponse:
    """The checks of Download (docs/api.md: Downloads, Download), then the preconditions of RFC 9110 section 13
    (304, 412, ``If-Range``), then the file (``part_number`` of a split result, or the single file) streamed from S3.

    Every attempt is recorded as an access event with the caller's user id, also for an operation that is
    not the caller's or does not exist: ``GRANTED`` once the file is open, ``NOT_MODIFIED`` for a 304, else
    the refusal's code (an unexpected failure's too). Preconditions come after authorization, so a
    non-member learns nothing from them. ``delivery=redirect`` answers, after every check, a ``303`` to a
    presigned storage URL (``REDIRECTED``), which takes no slot. Streamed downloads take a slot each
    (``ConnectionSlots``: 429 over the user's cap, 503 over the process's), and one that moves fewer than
    ``download_min_bytes_per_second`` over a window, or whose client accepts nothing for
    ``download_write_timeout_seconds``, is cut off, so slow readers cannot hold the slots or S3's connections.
    """
    operation_id = request.match_info["operation_id"]
    user_id = request[PRINCIPAL].user_id
    slots = request.app[DOWNLOAD_SLOTS]
    try:
        query = validate_query(DownloadQuery, request)
        async with request.app[POOL].acquire() as conn:
            row = await _authorize_download(conn, operation_id=operation_id, user_id=user_id)
        file = result_file(row, part_number)
        # The publication time: the write that made the operation SUCCEEDED set it.
        assert row.finished_at is not None
        validators = Validators(etag=file.stored.sha256, last_modified=row.finished_at)
        outcome = validators.evaluate(request.headers)
        if outcome is PreconditionOutcome.PRECONDITION_FAILED:
            raise ProblemError("PRECONDITION_FAILED", "A precondition of the request does not hold for this result.")
        if outcome is PreconditionOutcome.NOT_MODIFIED:
            await _record_access(request, operation_id, user_id, "NOT_MODIFIED")
            return web.Response(status=304, headers=_validator_headers(validators))
        wanted = validators.range_applies(request.headers)
        byte_range = _requested_range(request, file.stored.size_bytes) if wanted else None
        if query.delivery == "redirect":
            return await _redirect(request, file)
        slots.check(user_id)
    except Exception as refusal:
        await _record_refusal(request, operation_id, user_id, refusal)
        raise
    with slots.take(user_id), DOWNLOADS_STREAMING.track_inprogress():
        return await _send_result(request, file, byte_range, validators)


async def _redirect(request: web.Request, file: ResultFile) -> web.Response:
    """``303 See Other`` to a presigned URL of ``file`` (docs/api.md: Downloads, Download by redirect). The
    URL is a credential until it expires: it is in the ``Location`` header only, never in a log line, an
    access event or a metric, and the answer is neither stored nor named in a referrer.
    """
    settings = request.app[SETTINGS]
    url = await presigned_download(
        request.app[PRESIGNER],
        bucket=settings.s3_bucket,
        key=file.stored.key,
        expires_seconds=settings.download_redirect_seconds,
        content_type=file.content_type,
        content_disposition=content_disposition(file.filename),
    )
    await _record_access(request, file.operation_id, request[PRINCIPAL].user_id, "REDIRECTED")
    return web.Response(status=303, headers={**NO_STORE, "Location": url, "Referrer-Policy": "no-referrer"})


async def _record_access(request: web.Request, operation_id: str, user_id: str, outcome: str) -> None:
    async with request.app[POOL].acquire() as conn:
        await record_access_event(conn, operation_id=operation_id, user_id=user_id, action="download", outcome=outcome)
    # Counted once recorded: the figures and the access events tell the same story.
    DOWNLOADS.labels(outcome).inc()
    if outcome == "ACCESS_REVOKED":
        AUTHORIZATION_REFUSALS.labels("download").inc()


async def _record_refusal(request: web.Request, operation_id: str, user_id: str, refusal: Exception) -> None:
    """Record a download attempt that ``refusal`` ended: a ``ProblemError`` under its code; any other failure
    under the code the request middleware answers it with. Recording that other failure is best effort: a
    database that cannot take the record must not hide the failure itself.
    """
    # The id as requested; a U+0000, which Postgres text cannot hold, is stored as U+FFFD.
    operation_id = operation_id.replace("\x00", "\ufffd")
    if isinstance(refusal, ProblemError):
        await _record_access(request, operation_id, user_id, refusal.code)
        return
    outcome = "SERVICE_UNAVAILABLE" if isinstance(refusal, TRANSIENT_DATABASE_ERRORS) else "INTERNAL"
    try:
        await _record_access(request, operation_id, user_id, outcome)
    except TRANSIENT_DATABASE_ERRORS as exc:
        log.warning("download attempt not recorded", extra={"outcome": outcome, "error": type(exc).__name__})


async def _authorize_download(conn: asyncpg.Connection, *, operation_id: str, user_id: str) -> OperationView:
    if not is_operation_id(operation_id):
        raise not_found()
    row = await status_monitor.read_operation(conn, operation_id=operation_id, owner_id=user_id)
    if row is None:
        raise not_found()
    refusal = _STATE_REFUSALS.get(row.state)
    if refusal is not None:
        raise ProblemError(*refusal, state=row.state)
    if row.state != State.SUCCEEDED:
        raise ProblemError("RESULT_NOT_READY", "The export has not finished yet; poll the operation.", state=row.state)
    if not await is_member(conn, conversation_id=row.conversation_id, user_id=user_id):
        raise ProblemError("ACCESS_REVOKED", "You are no longer a member of this conversation.")
    return row


def _requested_range(request: web.Request, size: int) -> ByteRange | None:
    try:
        return parse_range(sole_field(request.headers, "Range"), size)
    except RangeNotSatisfiable:
        raise ProblemError(
            "RANGE_NOT_SATISFIABLE",
            "The requested range is outside the file.",
            headers={"Content-Range": f"bytes */{size}"},
        ) from None


async def _send_result(
    request: web.Request, file: ResultFile, byte_range: ByteRange | None, validators: Validators
) -> web.StreamResponse:
    user_id, operation_id = request[PRINCIPAL].user_id, file.operation_id
    length = byte_range.length if byte_range else file.stored.size_bytes
    # A HEAD answer has the GET's headers and no body (RFC 9110 9.3.2); a StreamResponse would send whatever
    # is written, and the client would read the file as the next response, so the file is not even opened.
    sends_body = length > 0 and request.method != hdrs.METH_HEAD
    try:
        body = await _open_result(request, file.stored.key, byte_range) if sends_body else None
    except Exception as refusal:
        await _record_refusal(request, operation_id, user_id, refusal)
        raise
    headers = _download_headers(file, byte_range, validators)
    response = web.StreamResponse(status=206 if byte_range else 200, headers=headers)
    response.content_length = length
    async with body if body is not None else contextlib.nullcontext():
        await _record_access(request, operation_id, user_id, "GRANTED")
        await response.prepare(request)
        if body is not None and not await _copy(request, body, response):
            return response  # the connection is closed; aiohttp only logs the access
    await response.write_eof()
    return response


async def _copy(request: web.Request, body: Any, response: web.StreamResponse) -> bool:
    """Stream ``body`` into ``response``; False when the transfer was cut (``transfer.stream``)."""
    settings = request.app[SETTINGS]
    try:
        await stream(
            request,
            response,
            body.iter_chunks(DOWNLOAD_CHUNK_BYTES),
            write_timeout=settings.download_write_timeout_seconds,
            min_bytes_per_second=settings.download_min_bytes_per_second,
            window_seconds=settings.download_rate_window_seconds,
        )
    except TransferCut as cut:
        log.info("download cut off", extra={"route": request.path, "reason": str(cut)})
        return False
    except STORAGE_READ_ERRORS as exc:
        # The status line and part of the file are sent: closing the connection is the only honest end. The
        # client sees a short body and resumes with Range and If-Range (docs/api.md: Downloads, Download).
        log.error("result unreadable mid-transfer", extra={"route": request.path, "error": type(exc).__name__})
        if request.transport is not None:
            request.transport.close()
        return False
    return True


async def _open_result(request: web.Request, key: str, byte_range: ByteRange | None) -> Any:
    arguments = {"Bucket": request.app[SETTINGS].s3_bucket, "Key": key}
    if byte_range:
        arguments["Range"] = byte_range.s3_range()
    try:
        # botocore's own timeouts apply per try; the whole opening, retries included, gets one deadline.
        async with asyncio.timeout(request.app[SETTINGS].s3_timeout_seconds):
            s3_object = await s3_client(request.app).get_object(**arguments)
    except TimeoutError as exc:
        raise _storage_unavailable(key, exc) from None
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "NoSuchKey":
            raise _storage_unavailable(key, exc) from None
        # SUCCEEDED promises the file: a missing object is lost data, for an operator, not for a retry.
        log.error("published result missing from storage", extra={"key": key})
        raise ProblemError("INTERNAL", "The result file is missing from storage; it cannot be downloaded.") from None
    except BotoCoreError as exc:
        raise _storage_unavailable(key, exc) from None
    return s3_object["Body"]


def _storage_unavailable(key: str, exc: Exception) -> ProblemError:
    log.error("result unreadable", extra={"key": key, "error": type(exc).__name__})
    return ProblemError(
        "SERVICE_UNAVAILABLE",
        "The result file cannot be read from storage right now; try again later.",
        headers={"Retry-After": "30"},
    )


def _validator_headers(validators: Validators) -> dict[str, str]:
    """The headers a 304 repeats from the 200 it stands for (RFC 9110 section 15.4.5)."""
    return {**NO_STORE, "ETag": validators.etag_header, "Last-Modified": validators.last_modified_header}


def _download_headers(file: ResultFile, byte_range: ByteRange | None, validators: Validators) -> dict[str, str]:
    headers = {
        **_validator_headers(validators),
        **DOWNLOAD_SAFETY,
        "Content-Type": file.content_type,
        "Content-Disposition": content_disposition(file.filename),
        # The whole file's digest, also on a 206 (RFC 9530 section 2: the selected representation's).
        "Repr-Digest": f"sha-256=:{base64.b64encode(bytes.fromhex(file.stored.sha256)).decode()}:",
        "Accept-Ranges": "bytes",
    }
    if byte_range:
        headers["Content-Range"] = byte_range.content_range()
    return headers


IDEMPOTENCY_KEY_PARAMETER = {
    "name": HEADER,
    "in": "header",
    "required": True,
    "description": "1-255 visible ASCII characters, optionally as an RFC 8941 string in double quotes; scoped to "
    "the caller, one key space for export submits and schedules. The same key and request within the replay "
    "window replays the first answer.",
    "schema": {"type": "string", "pattern": "^[!-~]{1,255}$"},
}

SUBMIT = Endpoint(
    route="submitExport",
    handler=submit_export,
    summary="Submit an export of a conversation",
    tag="exports",
    description="Checks in this order: token, query (none is taken), Idempotency-Key, body, membership, "
    "idempotency, quota. The body is at most `CHATEXPORT_EXPORT_REQUEST_MAX_BYTES` bytes (by default "
    f"{ApiPartSettings.model_fields['export_request_max_bytes'].default}, which fits the largest valid body).",
    parameters=(IDEMPOTENCY_KEY_PARAMETER,),
    body=Body(ExportSubmission, "What to export."),
    answers=(
        operation_answer(
            202,
            "The operation is stored with its scheduling intent (or this is a replay): its current representation.",
            {
                "Location": LOCATION_HEADER,
                "Retry-After": retry_after("Seconds before the first poll, while not terminal.", required=False),
                "Idempotent-Replayed": header("Present on a replay.", {"const": "true"}),
            },
        ),
    ),
    problems=(*KEY_PROBLEMS, *JSON_BODY_PROBLEMS, *EXPORT.problems, "NOTIFY_URL_REFUSED"),
)

# The result's validators (RFC 9110 section 8.8), sent with the file and with a 304.
_VALIDATORS = {
    "ETag": header("The file's quoted sha256.", {"type": "string", "pattern": '^"[0-9a-f]{64}"$'}, required=True),
    "Last-Modified": header("When the result was published (IMF-fixdate).", {"type": "string"}, required=True),
}

# The file in each format of the registry, and gzip-compressed (docs/api.md: Submitting an export, The file; Export
# options).
_FILE_CONTENT = {
    **{
        entry.content_type: {"schema": {"type": "string", "description": entry.description}}
        for entry in FORMATS.values()
    },
    GZIP_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary", "description": "The file, gzip-compressed."}},
}


def _file_answer(status: int, description: str, *, partial: bool) -> Answer:
    """A download's answer with the file (``_download_headers``)."""
    headers = {
        "Cache-Control": NO_STORE_HEADER,
        "Content-Length": header("Bytes in this response.", {"type": "integer", "minimum": 0}, required=True),
        "Content-Disposition": header(
            "`<conversation>-<creation date, UTC>.<extension>` (a part: `...part-<n>.<extension>`); `filename*` "
            "(RFC 8187) when the name is not plain ASCII.",
            {"type": "string", "pattern": '^attachment; filename=".+"'},
            required=True,
        ),
        "Repr-Digest": header(
            "The whole file's sha-256 (RFC 9530), also on a 206.",
            {"type": "string", "pattern": "^sha-256=:[A-Za-z0-9+/]{43}=:$"},
            required=True,
        ),
        "Content-Security-Policy": header(
            "A downloaded HTML file never runs with this origin.", {"const": "sandbox"}, required=True
        ),
        "X-Content-Type-Options": header("No type sniffing.", {"const": "nosniff"}, required=True),
        **_VALIDATORS,
        "Accept-Ranges": header("One byte range per request.", {"const": "bytes"}, required=True),
    }
    if partial:
        headers["Content-Range"] = header(
            "The bytes sent.", {"type": "string", "pattern": "^bytes [0-9]+-[0-9]+/[0-9]+$"}, required=True
        )
    return Answer(status, description, content=_FILE_CONTENT, headers=headers)


def _download_endpoint(*, part: bool) -> Endpoint:
    what = "one part of a split result (`result.parts`)" if part else "the file of a result that is not split"
    return Endpoint(
        route="downloadResultPart" if part else "downloadResult",
        handler=download_part if part else download_result,
        summary=f"Download {what}",
        tag="exports",
        description="Checks in this order: token, owner, state, the owner's current membership, then the "
        "preconditions of RFC 9110 section 13.2.2, then the range. Every attempt is recorded as an access event. "
        "Each user has at most `CHATEXPORT_DOWNLOAD_PER_USER_CONCURRENCY` downloads open (429 beyond). With "
        "`delivery=redirect`, after the same checks, a 303 to a presigned storage URL that lives "
        "`CHATEXPORT_DOWNLOAD_REDIRECT_SECONDS`: GET it without an `Authorization` header (the URL is the "
        "credential; send `Range` and `If-Match` with the storage's own ETag to it); no download cap applies.",
        query=DownloadQuery,
        parameters=(
            header_parameter(
                "Range",
                "One byte range: `bytes=a-b`, `bytes=a-` or `bytes=-n`; several ranges or bad syntax: ignored.",
            ),
            header_parameter("If-Match", "412 unless one of these entity-tags matches strongly (or `*`)."),
            header_parameter("If-Unmodified-Since", "Without If-Match: 412 if the result was published later."),
            header_parameter("If-None-Match", "304 when one of these entity-tags matches weakly (or `*`)."),
            header_parameter("If-Modified-Since", "Without If-None-Match: 304 unless the result was published later."),
            header_parameter("If-Range", "Range applies only when this is the current ETag or exactly Last-Modified."),
        ),
        answers=(
            _file_answer(200, "The whole file.", partial=False),
            _file_answer(206, "The requested byte range.", partial=True),
            Answer(
                303,
                "`delivery=redirect`: the file is at the `Location`, a presigned storage URL whose answer is an "
                "attachment with the file's name and type and `Cache-Control: no-store`.",
                headers={
                    "Location": header(
                        "The presigned storage URL.", {"type": "string", "format": "uri"}, required=True
                    ),
                    "Cache-Control": NO_STORE_HEADER,
                    "Referrer-Policy": header("The URL is never sent on.", {"const": "no-referrer"}, required=True),
                },
            ),
            Answer(
                304,
                "Not modified: the client's copy is current.",
                headers={"Cache-Control": NO_STORE_HEADER, **_VALIDATORS},
            ),
        ),
        problems=(
            "VALIDATION_FAILED",
            "NOT_FOUND",
            "RESULT_EXPIRED",
            "RESULT_NOT_READY",
            "RESULT_NOT_AVAILABLE",
            *(() if part else ("RESULT_IN_PARTS",)),
            "ACCESS_REVOKED",
            "PRECONDITION_FAILED",
            "RANGE_NOT_SATISFIABLE",
            "TOO_MANY_DOWNLOADS",
        ),
    )


ENDPOINTS = (SUBMIT, _download_endpoint(part=False), _download_endpoint(part=True))
