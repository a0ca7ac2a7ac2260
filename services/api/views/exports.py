"""Export submission and result download: ``/v3/conversations/{cid}/exports``, ``/v3/exports/{id}/result``."""

from __future__ import annotations

import logging

import asyncpg
from aiohttp import web

from services.api.bodies import read_model
from services.api.idempotency import HEADER, parse_idempotency_key
from services.api.keys import POOL, PRINCIPAL, SETTINGS, s3_client
from services.api.problems import Problem, not_found
from services.api.ranges import ByteRange, RangeNotSatisfiable, parse_range
from services.api.repository import operations as repo
from services.api.repository.messages import is_member
from services.api.representation import RESULT_CONTENT_TYPE, operation_url
from services.api.schemas import ExportSubmission
from services.api.submission import submit
from services.api.views.operations import NO_STORE, operation_response
from shared.fingerprint import ExportRequest
from shared.ids import is_operation_id
from shared.states import State

log = logging.getLogger(__name__)

DOWNLOAD_CHUNK_BYTES = 256 * 1024


async def submit_export(request: web.Request) -> web.Response:
    """``POST /v3/conversations/{cid}/exports``: checks in the order of contract 5.1, then 202."""
    settings = request.app[SETTINGS]
    owner_id = request[PRINCIPAL].user_id
    key = parse_idempotency_key(request.headers.get(HEADER))
    body = await read_model(request, ExportSubmission, max_bytes=settings.export_request_max_bytes)
    conversation_id = request.match_info["cid"]
    export = ExportRequest(format=body.format, before_seq=body.before_seq, after_seq=body.after_seq)
    async with request.app[POOL].acquire() as conn:
        async with conn.transaction():
            if not await is_member(conn, conversation_id=conversation_id, user_id=owner_id):
                raise not_found()
            submitted = await submit(
                conn,
                settings,
                owner_id=owner_id,
                conversation_id=conversation_id,
                idempotency_key=key,
                request=export,
            )
        # Read after COMMIT: a replay shows the operation's current state.
        row = await repo.get_operation(conn, operation_id=submitted.operation_id, owner_id=owner_id)
    assert row is not None
    headers = {"Location": operation_url(submitted.operation_id)}
    if submitted.replayed:
        headers["Idempotent-Replayed"] = "true"
    response = operation_response(row, status=202, **headers)
    response.headers["Retry-After"] = "1"  # contract 5.1: the first poll after a submit
    return response


# Refusals of contract 5.5, by state, in the order they are checked.
_STATE_REFUSALS: dict[str, tuple[str, str]] = {
    State.EXPIRED: ("RESULT_EXPIRED", "The result's retention has ended and the file was deleted."),
    State.CANCELED: ("RESULT_NOT_AVAILABLE", "The export was canceled; it has no result."),
    State.FAILED: ("RESULT_NOT_AVAILABLE", "The export failed; it has no result."),
    State.FAILED_REPAIR: ("RESULT_NOT_AVAILABLE", "The export needs an operator; it has no result."),
}


async def download_result(request: web.Request) -> web.StreamResponse:
    """``GET /v3/exports/{id}/result``: checks of contract 5.5, then the file streamed from S3.

    Every attempt, granted or refused, is recorded as an access event.
    """
    operation_id = request.match_info["operation_id"]
    user_id = request[PRINCIPAL].user_id
    async with request.app[POOL].acquire() as conn:
        try:
            row = await _authorize_download(conn, operation_id=operation_id, user_id=user_id)
        except Problem as refusal:
            # The id as requested; a U+0000, which Postgres text cannot hold, is stored as U+FFFD.
            await repo.record_access_event(
                conn,
                operation_id=operation_id.replace("\x00", "\ufffd"),
                user_id=user_id,
                action="download",
                outcome=refusal.code,
            )
            raise
        await repo.record_access_event(
            conn, operation_id=operation_id, user_id=user_id, action="download", outcome="GRANTED"
        )
    return await _stream_result(request, row)


async def _authorize_download(conn: asyncpg.Connection, *, operation_id: str, user_id: str) -> asyncpg.Record:
    if not is_operation_id(operation_id):
        raise not_found()
    row = await repo.get_operation(conn, operation_id=operation_id, owner_id=user_id)
    if row is None:
        raise not_found()
    refusal = _STATE_REFUSALS.get(row["state"])
    if refusal is not None:
        raise Problem(*refusal, state=row["state"])
    if row["state"] != State.SUCCEEDED:
        raise Problem("RESULT_NOT_READY", "The export has not finished yet; poll the operation.", state=row["state"])
    if not await is_member(conn, conversation_id=row["conversation_id"], user_id=user_id):
        raise Problem("ACCESS_REVOKED", "You are no longer a member of this conversation.")
    return row


async def _stream_result(request: web.Request, row: asyncpg.Record) -> web.StreamResponse:
    size = row["result_size_bytes"]
    try:
        byte_range = parse_range(request.headers.get("Range"), size)
    except RangeNotSatisfiable:
        raise Problem(
            "RANGE_NOT_SATISFIABLE",
            "The requested range is outside the file.",
            headers={"Content-Range": f"bytes */{size}"},
        ) from None
    response = web.StreamResponse(status=206 if byte_range else 200, headers=_download_headers(row, byte_range))
    response.content_length = byte_range.length if byte_range else size
    settings = request.app[SETTINGS]
    arguments = {"Bucket": settings.s3_bucket, "Key": row["result_key"]}
    if byte_range:
        arguments["Range"] = byte_range.s3_range()
    if response.content_length == 0:
        await response.prepare(request)
        await response.write_eof()
        return response
    s3_object = await s3_client(request.app).get_object(**arguments)
    async with s3_object["Body"] as stream:
        await response.prepare(request)
        async for chunk in stream.iter_chunks(DOWNLOAD_CHUNK_BYTES):
            await response.write(chunk)
    await response.write_eof()
    return response


def _download_headers(row: asyncpg.Record, byte_range: ByteRange | None) -> dict[str, str]:
    headers = {
        **NO_STORE,
        "Content-Type": RESULT_CONTENT_TYPE,
        "Content-Disposition": f'attachment; filename="{row["conversation_id"]}-{row["operation_id"]}.jsonl"',
        "ETag": f'"{row["result_sha256"]}"',
        "Accept-Ranges": "bytes",
    }
    if byte_range:
        headers["Content-Range"] = byte_range.content_range()
    return headers
