"""Admin routes: member sets and history import (docs/api.md: Message store), the requeue of a parked
operation (docs/states.md: States and failure model), the admin view of an operation, the list of every user's
operations and the view of a conversation.

The middleware already required the ``admin`` scope. Admins may know which conversations and operations
exist, so a path id that breaks the id syntax is a 422 naming it, not the members' 404, and a missing
conversation is ``CONVERSATION_NOT_FOUND`` rather than the members' ``NOT_FOUND`` (docs/api.md: API reference).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import ValidationError

from services.api.http.bodies import (
    check_body_bytes,
    read_empty_input,
    read_limited,
    read_model,
    validate_query,
    validation_errors,
)
from services.api.http.keys import POOL, SETTINGS
from services.api.http.pagination import decode_cursor, split_page
from services.api.http.problems import ProblemError, not_found, validation_failed
from services.api.http.responses import NO_STORE, json_response
from services.api.http.schemas import AdminOperationListQuery, EmptyQuery, ImportedMessage, MemberSet
from shared.ids import is_operation_id, is_valid_id
from shared.repair import requeue
from shared.repository import (
    access_events,
    artifacts,
    attempts,
    chunks,
    message_store,
    schedules,
    status_monitor,
    webhook_deliveries,
)
from shared.representation import represent_for_admin, represent_for_admin_list
from shared.routes import path

log = logging.getLogger(__name__)

# 10,000 member ids of 64 characters with their JSON quoting fit in about 700 KB.
MEMBERS_REQUEST_MAX_BYTES = 1024 * 1024
# NDJSON is the import's format; application/json is accepted too, since no route answers 415 to it
# (docs/api.md: Error codes), and one JSON object is a one-line NDJSON batch.
IMPORT_MEDIA_TYPES = ("application/x-ndjson", "application/json")
# The admin view lists at most this many access events, the newest; a download loop or an id guessed
# over and over must not make the answer unbounded.
ACCESS_EVENTS_SHOWN = 1000


def _path_id(request: web.Request, name: str) -> str:
    value = request.match_info[name]
    if not is_valid_id(value):
        raise validation_failed([{"loc": ["path", name], "msg": "must be 1-64 characters of [A-Za-z0-9_.:-]"}])
    return value


def _conversation_not_found(conversation_id: str) -> ProblemError:
    # The id passed the id syntax, so it is safe to echo; the detail tells the operator the next step.
    return ProblemError(
        "CONVERSATION_NOT_FOUND",
        f"There is no conversation {conversation_id}; create it with PUT "
        f"{path('adminPutConversation', cid=conversation_id)} first.",
    )


def _operation_path_id(request: web.Request) -> str:
    value = request.match_info["operation_id"]
    if not is_operation_id(value):
        raise validation_failed([{"loc": ["path", "operation_id"], "msg": "must be 1-64 characters of [A-Za-z0-9_-]"}])
    return value


async def put_conversation(request: web.Request) -> web.Response:
    """``PUT /admin/conversations/{cid}`` ``{"members": [...]}``: create or replace the member set; 204."""
    validate_query(EmptyQuery, request)
    conversation_id = _path_id(request, "cid")
    member_set = await read_model(request, MemberSet, max_bytes=MEMBERS_REQUEST_MAX_BYTES)
    async with request.app[POOL].acquire() as conn, conn.transaction():
        await message_store.put_members(conn, conversation_id=conversation_id, members=member_set.members)
        await schedules.pause_where_access_revoked(conn, conversation_id=conversation_id)
    log.info(
        "conversation members replaced",
        extra={"conversation_id": conversation_id, "members": len(member_set.members)},
    )
    return web.Response(status=204)


async def get_conversation(request: web.Request) -> web.Response:
    """``GET /admin/conversations/{cid}``: ``{"conversation_id", "members", "last_seq", "message_count"}``
    with ``members`` sorted by code point and ``message_count`` the messages not recalled, read as of one
    moment; ``Cache-Control: no-store``. 404 ``CONVERSATION_NOT_FOUND`` when it does not exist.
    """
    validate_query(EmptyQuery, request)
    conversation_id = _path_id(request, "cid")
    async with request.app[POOL].acquire() as conn:
        row = await message_store.conversation_summary(conn, conversation_id=conversation_id)
    if row is None:
        raise _conversation_not_found(conversation_id)
    body = {
        "conversation_id": row.conversation_id,
        "members": list(row.members),
        "last_seq": row.last_seq,
        "message_count": row.message_count,
    }
    return json_response(body, headers=NO_STORE)


async def add_member(request: web.Request) -> web.Response:
    """``PUT /admin/conversations/{cid}/members/{uid}``: add one member (idempotent); 204, or 404
    ``CONVERSATION_NOT_FOUND``.
    """
    return await _change_member(request, message_store.add_member)


async def remove_member(request: web.Request) -> web.Response:
    """``DELETE /admin/conversations/{cid}/members/{uid}``: remove one member (idempotent); 204, or 404
    ``CONVERSATION_NOT_FOUND``.
    """
    return await _change_member(request, message_store.remove_member)


async def _change_member(request: web.Request, change: Callable[..., Awaitable[bool]]) -> web.Response:
    validate_query(EmptyQuery, request)
    conversation_id, user_id = _path_id(request, "cid"), _path_id(request, "uid")
    async with request.app[POOL].acquire() as conn, conn.transaction():
        if not await change(conn, conversation_id=conversation_id, user_id=user_id):
            raise _conversation_not_found(conversation_id)
        # A removed owner's schedules pause in the removal's transaction (docs/schedules.md: When a run cannot go on).
        await schedules.pause_where_access_revoked(conn, conversation_id=conversation_id)
    return web.Response(status=204)


async def import_messages(request: web.Request) -> web.Response:
    """``POST /admin/conversations/{cid}/messages:import``: store NDJSON history lines in line order.

    Every line is checked before anything is stored: one bad line (not UTF-8, not JSON, or breaking the
    schema) rejects the batch with a 422 naming it, 1-based, with that line's errors. Answers
    ``{"imported": N, "skipped": M}``; 404 ``CONVERSATION_NOT_FOUND`` when the conversation is missing,
    checked after the lines, and then nothing is stored.
    """
    validate_query(EmptyQuery, request)
    settings = request.app[SETTINGS]
    conversation_id = _path_id(request, "cid")
    if request.body_exists and request.content_type not in IMPORT_MEDIA_TYPES:
        raise ProblemError("UNSUPPORTED_MEDIA_TYPE", "Send the lines as application/x-ndjson.")
    raw = await read_limited(request, max_bytes=settings.import_request_max_bytes)
    # Up to 64 MiB of lines take seconds of CPU: parse them off the event loop so other requests and
    # the probes keep being answered meanwhile.
    lines = await asyncio.to_thread(_parse_lines, raw, body_max_bytes=settings.import_body_max_bytes)
    async with request.app[POOL].acquire() as conn:
        try:
            result = await message_store.import_messages(conn, conversation_id=conversation_id, lines=lines)
        except message_store.ConversationNotFound:
            raise _conversation_not_found(conversation_id) from None
    log.info(
        "messages imported",
        extra={"conversation_id": conversation_id, "imported": result.imported, "skipped": result.skipped},
    )
    return json_response({"imported": result.imported, "skipped": result.skipped})


async def requeue_operation(request: web.Request) -> web.Response:
    """``POST /admin/operations/{operation_id}/requeue``: FAILED_REPAIR -> QUEUED with a fresh attempt budget
    (docs/states.md: States and failure model); 202 ``{"operation_id", "state": "QUEUED"}``. The body is empty or
    ``{}`` and there is no query (else 415, 413, 400 or 422 as for cancel). 404 when unknown; 409
    ``NOT_REQUEUEABLE`` with ``state`` from any other state, which is left alone.
    """
    await read_empty_input(request)
    operation_id = _operation_path_id(request)
    async with request.app[POOL].acquire() as conn:
        outcome = await requeue(conn, operation_id=operation_id)
    if outcome.state is None:
        raise not_found()
    if not outcome.requeued:
        raise ProblemError(
            "NOT_REQUEUEABLE",
            f"Only a FAILED_REPAIR operation can be requeued; this one is {outcome.state}.",
            state=outcome.state,
        )
    log.info("operation requeued by an admin", extra={"operation_id": operation_id})
    return json_response({"operation_id": operation_id, "state": outcome.state}, status=202)


async def list_operations(request: web.Request) -> web.Response:
    """``GET /admin/operations?state=&conversation_id=&owner_id=&limit=&cursor=``: every user's operations,
    newest first, paged and validated like ``GET /v3/operations`` (bad or unknown parameters are 422 at
    ``["query", name]``); ``{"operations": [...], "next_cursor": str | null}``, ``Cache-Control: no-store``.

    Each item is the admin view of ``get_operation`` without its attempts, artifacts and access events,
    so that a page is at most ``limit`` rows whatever the operations' histories (docs/api.md: Administration,
    Admin list of operations).
    """
    query = validate_query(AdminOperationListQuery, request)
    after = decode_cursor(query.cursor)
    async with request.app[POOL].acquire() as conn:
        rows = await status_monitor.read_operations(
            conn,
            state=query.state.value if query.state else None,
            conversation_id=query.conversation_id,
            owner_id=query.owner_id,
            limit=query.limit + 1,
            after=after,
        )
    page, next_cursor = split_page(rows, limit=query.limit)
    body = {"operations": [represent_for_admin_list(row) for row in page], "next_cursor": next_cursor}
    return json_response(body, headers=NO_STORE)


async def get_operation(request: web.Request) -> web.Response:
    """``GET /admin/operations/{operation_id}``: the operation whoever owns it, with its owner, lease and generation,
    its attempts (one per claim), its artifacts (object keys, never download URLs), its newest
    ``ACCESS_EVENTS_SHOWN`` access events and a chunked export's chunks, all read as of one moment; ``Cache-Control:
    no-store``. 404 when unknown.
    """
    validate_query(EmptyQuery, request)
    operation_id = _operation_path_id(request)
    async with request.app[POOL].acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        row = await status_monitor.read_operation(conn, operation_id=operation_id, owner_id=None)
        if row is None:
            raise not_found()
        body = represent_for_admin(
            row,
            attempts=await attempts.list_attempts(conn, operation_id=operation_id),
            artifacts=await artifacts.list_artifacts(conn, operation_id=operation_id),
            access_events=await access_events.newest_access_events(
                conn, operation_id=operation_id, limit=ACCESS_EVENTS_SHOWN
            ),
            access_events_total=await access_events.count_access_events(conn, operation_id=operation_id),
            webhook_deliveries=await webhook_deliveries.list_for_operation(conn, operation_id=operation_id),
            chunks=await chunks.chunks_of(conn, operation_id=operation_id),
        )
    return json_response(body, headers=NO_STORE)


_JSON_WHITESPACE = b" \t\r"


def _parse_lines(raw: bytes, *, body_max_bytes: int) -> list[ImportedMessage]:
    chunks = raw.split(b"\n")
    # Newlines at the end close the last line rather than open empty ones; an empty line inside is bad.
    # Blank means JSON's own whitespace only, as inside a line: bytes.strip() would also drop \v and \f.
    while chunks and not chunks[-1].strip(_JSON_WHITESPACE):
        chunks.pop()
    return [_parse_line(number, chunk, body_max_bytes=body_max_bytes) for number, chunk in enumerate(chunks, 1)]


def _parse_line(number: int, chunk: bytes, *, body_max_bytes: int) -> ImportedMessage:
    try:
        # pydantic parses the JSON itself: bad UTF-8, bad JSON and schema errors all name the line.
        line = ImportedMessage.model_validate_json(chunk)
    except ValidationError as exc:
        raise validation_failed(
            validation_errors(exc, prefix=("body", number)),
            f"Line {number} is not a valid message; nothing was imported.",
        ) from None
    check_body_bytes(line.body, max_bytes=body_max_bytes, loc=["body", number, "body"])
    return line


# Route name (shared.routes) -> handler, for the route table (services.api.routes). Operator tooling: not in
# the OpenAPI document, so these routes have no ``Endpoint``.
HANDLERS: dict[str, Handler] = {
    "adminPutConversation": put_conversation,
    "adminGetConversation": get_conversation,
    "adminAddMember": add_member,
    "adminRemoveMember": remove_member,
    "adminImportMessages": import_messages,
    "adminListOperations": list_operations,
    "adminGetOperation": get_operation,
    "adminRequeueOperation": requeue_operation,
}
