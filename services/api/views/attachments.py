"""Attachments for members: upload a file into a conversation, fetch one (docs/api.md: Message store,
Attachments). A message carries an uploaded file once a send names it (``views.messages``).

Checks run in the message store's order: the token (middleware), the query, membership (404, identical for a
missing conversation), then the body (415 / 413 / 408 / 400) as it streams into the bucket.
"""

from __future__ import annotations

import logging
import re
import zlib

from aiohttp import web

from services.api.exporting.results import content_disposition
from services.api.http.bodies import body_chunks, validate_query
from services.api.http.contract import Answer, Body, Endpoint, header
from services.api.http.keys import POOL, PRESIGNER, PRINCIPAL, SETTINGS, UPLOAD_SLOTS, s3_client
from services.api.http.problems import ProblemError, not_found
from services.api.http.responses import NO_STORE, json_response
from services.api.http.schemas import AttachmentUploadQuery, EmptyQuery, StoredAttachment
from shared.artifact_removal import remove_object
from shared.ids import new_attachment_id
from shared.object_writer import ObjectWriter, StoredBytesDiffer
from shared.repository import attachments, message_store
from shared.routes import path
from shared.storage import MIN_UPLOAD_BYTES_PER_SECOND, STORAGE_ERRORS, attachment_key, presigned_download

log = logging.getLogger(__name__)

# A media type as RFC 9110 section 8.3.1 writes one, without its parameters.
_MEDIA_TYPE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+/[!#$%&'*+.^_`|~0-9A-Za-z-]+")
DEFAULT_CONTENT_TYPE = "application/octet-stream"


async def upload_attachment(request: web.Request) -> web.Response:
    """``POST /v2/conversations/{cid}/attachments?name=``: store the body as an attachment of the conversation,
    its size, sha256 and CRC-32 measured as it streams into the bucket; 201 with the attachment.

    Its row is UPLOADING before the first byte is stored and STORED once the object is complete; an upload that
    fails removes what it stored, and one whose api stops midway is left to the janitor (docs/retention.md:
    Orphan objects and uploads).
    """
    query = validate_query(AttachmentUploadQuery, request)
    conversation_id = request.match_info["cid"]
    uploader_id = request[PRINCIPAL].user_id
    # The field as sent: aiohttp's parsed content type falls back to a default for a value it cannot read.
    content_type = request.headers.get("Content-Type", DEFAULT_CONTENT_TYPE).split(";")[0].strip().lower()
    if not _MEDIA_TYPE.fullmatch(content_type):
        raise ProblemError("UNSUPPORTED_MEDIA_TYPE", "Send the file with a Content-Type of the form type/subtype.")
    async with request.app[POOL].acquire() as conn:
        if not await message_store.is_member(conn, conversation_id=conversation_id, user_id=uploader_id):
            raise not_found()
    # Each upload holds up to two S3 parts in memory: so many at once per process, fewer per user.
    with request.app[UPLOAD_SLOTS].take(uploader_id):
        return await _store(request, query.name, content_type, conversation_id, uploader_id)


async def _store(
    request: web.Request, file_name: str, content_type: str, conversation_id: str, uploader_id: str
) -> web.Response:
    """The upload's row, its body streamed into the bucket, the row STORED; the 201."""
    settings = request.app[SETTINGS]
    attachment_id = new_attachment_id()
    key = attachment_key(settings, attachment_id)
    async with request.app[POOL].acquire() as conn:
        await attachments.begin_upload(
            conn,
            attachment_id=attachment_id,
            conversation_id=conversation_id,
            uploader_id=uploader_id,
            file_name=file_name,
            content_type=content_type,
            object_key=key,
        )
    max_bytes = settings.attachment_max_bytes
    # The whole body within the request timeout plus its size at the slowest rate an upload may go.
    timeout = settings.request_body_timeout_seconds + max_bytes / MIN_UPLOAD_BYTES_PER_SECOND
    # The writer every export file uses: about two parts in memory, what S3 stored checked against what was
    # sent; the CRC-32 a ZIP's local header needs is measured beside it (docs/api.md: Message store, Attachments).
    writer = ObjectWriter.in_bucket(s3_client(request.app), settings, key=key, content_type=content_type)
    crc32 = 0
    try:
        async for chunk in body_chunks(request, max_bytes=max_bytes, timeout_seconds=timeout):
            crc32 = zlib.crc32(chunk, crc32)
            await writer.write(chunk)
        stored = await writer.finish()
        async with request.app[POOL].acquire() as conn:
            finished = await attachments.finish_upload(
                conn, attachment_id=attachment_id, size_bytes=stored.size_bytes, sha256=stored.sha256, crc32=crc32
            )
        if not finished:
            raise ProblemError("SERVICE_UNAVAILABLE", "The upload took too long; send it again.")
    except BaseException as failure:
        await writer.abandon()
        await _discard(request, attachment_id, key)
        if isinstance(failure, (*STORAGE_ERRORS, StoredBytesDiffer)):
            log.warning("attachment upload failed", extra={"error": type(failure).__name__}, exc_info=True)
            raise ProblemError(
                "SERVICE_UNAVAILABLE", "The file store is unavailable; try again later.", headers={"Retry-After": "30"}
            ) from None
        raise
    log.info("attachment stored", extra={"conversation_id": conversation_id, "size_bytes": stored.size_bytes})
    shown = StoredAttachment(
        attachment_id=attachment_id,
        file_name=file_name,
        content_type=content_type,
        size_bytes=stored.size_bytes,
        sha256=stored.sha256,
    )
    location = path("getAttachment", cid=conversation_id, attachment_id=attachment_id)
    return json_response(shown.model_dump(exclude_none=True), status=201, headers={"Location": location})


async def _discard(request: web.Request, attachment_id: str, key: str) -> None:
    """Remove what a failed upload stored (its object and any multipart upload), then its row; what a failure
    here leaves, the janitor removes."""
    try:
        await remove_object(s3_client(request.app), bucket=request.app[SETTINGS].s3_bucket, key=key)
        async with request.app[POOL].acquire() as conn:
            await attachments.forget_upload(conn, attachment_id=attachment_id)
    except Exception:
        log.warning("a failed upload's leftovers wait for the janitor", exc_info=True)


async def get_attachment(request: web.Request) -> web.Response:
    """``GET /v2/conversations/{cid}/attachments/{attachment_id}``: ``303 See Other`` to a presigned URL of the
    file, served as a download under its name (docs/api.md: Message store, Attachments).
    """
    validate_query(EmptyQuery, request)
    settings = request.app[SETTINGS]
    conversation_id = request.match_info["cid"]
    user_id = request[PRINCIPAL].user_id
    async with request.app[POOL].acquire() as conn:
        if not await message_store.is_member(conn, conversation_id=conversation_id, user_id=user_id):
            raise not_found()
        attachment = await attachments.served_attachment(
            conn,
            conversation_id=conversation_id,
            attachment_id=request.match_info["attachment_id"],
            user_id=user_id,
        )
    if attachment is None:
        raise not_found()
    # Always a download, never shown inline: an uploaded HTML or SVG file must not run in a browser.
    url = await presigned_download(
        request.app[PRESIGNER],
        bucket=settings.s3_bucket,
        key=attachment.object_key,
        expires_seconds=settings.download_redirect_seconds,
        content_type=attachment.content_type,
        content_disposition=content_disposition(attachment.file_name),
    )
    return web.Response(status=303, headers={**NO_STORE, "Location": url, "Referrer-Policy": "no-referrer"})


ENDPOINTS = (
    Endpoint(
        route="uploadAttachment",
        handler=upload_attachment,
        summary="Upload a file into a conversation the caller is a member of",
        tag="messages",
        description="The body is the file, its `Content-Type` the file's (default `application/octet-stream`), "
        "at most `CHATEXPORT_ATTACHMENT_MAX_BYTES` (default 100 MiB). A send then names its `attachment_id`.",
        query=AttachmentUploadQuery,
        body=Body(None, "The file's bytes.", content={"*/*": {"schema": {"type": "string", "format": "binary"}}}),
        answers=(
            Answer(
                201,
                "Stored, with its size and SHA-256.",
                StoredAttachment,
                headers={"Location": header("The attachment.", {"type": "string"}, required=True)},
            ),
        ),
        problems=(
            "VALIDATION_FAILED",
            "NOT_FOUND",
            "UNSUPPORTED_MEDIA_TYPE",
            "UNSUPPORTED_CONTENT_ENCODING",
            "PAYLOAD_TOO_LARGE",
            "REQUEST_TIMEOUT",
            "TOO_MANY_UPLOADS",
            "SERVICE_UNAVAILABLE",
        ),
    ),
    Endpoint(
        route="getAttachment",
        handler=get_attachment,
        summary="Fetch a file a message carries",
        tag="messages",
        description="A member gets a redirect to the file while a message that is not recalled carries it (the "
        "uploader also before any message does). Anyone else, a missing attachment or conversation: the same 404.",
        answers=(
            Answer(
                303,
                "The file, at a presigned URL valid for `CHATEXPORT_DOWNLOAD_REDIRECT_SECONDS`.",
                headers={"Location": header("The presigned URL.", {"type": "string"}, required=True)},
            ),
        ),
        problems=("VALIDATION_FAILED", "NOT_FOUND"),
    ),
)
