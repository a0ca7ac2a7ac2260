"""The status monitor: ``/v3/operations``, ``/v3/operations/{id}`` and its event stream (docs/api.md: Operations,
Operation; docs/api.md: Operations, Waiting for a change; docs/states.md: States and failure model, Cancel)."""

from __future__ import annotations

from functools import partial
from typing import Any

from aiohttp import web

from services.api.exporting.waiting import Reader, operation_events, read_or_404, wait_for_state_change, watching
from services.api.http.bodies import JSON_BODY_PROBLEMS, JSON_MEDIA_TYPE, read_empty_input, validate_query
from services.api.http.contract import (
    LOCATION_HEADER,
    NO_STORE_HEADER,
    OPERATION_ETAG_HEADER,
    Answer,
    Body,
    Endpoint,
    header_parameter,
    ref,
    retry_after,
)
from services.api.http.fields import field_list
from services.api.http.keys import POOL, PRINCIPAL
from services.api.http.pagination import decode_cursor, page_endpoint, split_page
from services.api.http.preconditions import tag_list_matches
from services.api.http.problems import ProblemError, not_found
from services.api.http.responses import (
    NO_STORE,
    json_response,
    kept_operation_response,
    operation_answer,
    operation_not_modified,
    operation_response,
    rendered_operation,
)
from services.api.http.schemas import (
    EmptyQuery,
    EmptyRequest,
    Operation,
    OperationListQuery,
    OperationPage,
    OperationQuery,
)
from shared import tracing
from shared.db import await_replication
from shared.ids import is_operation_id
from shared.repository import status_monitor
from shared.repository.operation_view import OperationView, Stamped
from shared.repository.outbox import enqueue_run
from shared.representation import EVENT_STREAM, is_terminal, represent
from shared.routes import path
from shared.states import State


async def get_operation(request: web.Request) -> web.Response:
    """``GET /v3/operations/{id}[?wait=N]``: the owner's view; anyone else the same 404 as for a missing id.
    With ``wait``, answered once the state changes or after ``wait`` seconds (``waiting``). An
    ``If-None-Match`` naming the current version gets ``304``; with ``wait`` too, the wait starts only when
    it does (docs/api.md: Operations, Conditional polls).
    """
    query = validate_query(OperationQuery, request)
    read = _reader(request)
    if_none_match = field_list(request.headers, "If-None-Match")
    known = None if if_none_match is None else partial(_names_version, if_none_match)
    if query.wait is None:
        # What names the representation first: it answers a 304, or a 200 from the rendering this process
        # keeps, without the rest of the row (docs/benchmark.md: The poll's own work).
        stamp = await read_or_404(read.stamp)
        if known is not None and known(stamp):
            return operation_not_modified(stamp)
        kept = kept_operation_response(stamp)
        if kept is not None:
            return kept
        row = await read_or_404(read)
    else:
        row = await wait_for_state_change(request, read, wait_seconds=query.wait, known=known)
    return operation_not_modified(row) if known is not None and known(row) else operation_response(row)


def _names_version(if_none_match: str, row: Stamped) -> bool:
    """Whether the ``If-None-Match`` list names ``row``'s version (weak comparison, RFC 9110 section 13.1.2)."""
    return tag_list_matches(if_none_match, str(row.version), weak=True)


async def stream_operation_events(request: web.Request) -> web.StreamResponse:
    """``GET /v3/operations/{id}/events``: ``text/event-stream`` of ``operation`` events, one representation
    each with the operation's version as ``id``, until a terminal state; ``Last-Event-ID`` as
    ``operation_events`` takes it (docs/api.md: Operations, Waiting for a change). A reconnect whose
    ``Last-Event-ID`` is already the terminal version is answered ``204 No Content``: the HTML standard's
    signal that stops ``EventSource`` from reconnecting.
    """
    validate_query(EmptyQuery, request)
    read = _reader(request)
    last_event_id = _last_event_id(request)
    current = await read_or_404(read)
    if is_terminal(current) and current.version == last_event_id:
        # Before taking a wait slot: nothing is left to wait for, so the cap must not make it a 429.
        return web.Response(status=204, headers=NO_STORE)
    async with watching(request, read, kind="event_stream") as (row, subscription):
        response = web.StreamResponse(headers={**NO_STORE, "Content-Type": EVENT_STREAM, "X-Accel-Buffering": "no"})
        await response.prepare(request)
        events = operation_events(request, read, row, subscription, last_event_id=last_event_id)
        try:
            async for event in events:
                await response.write(_event(event))
        except ConnectionError:
            return response
    await response.write_eof()
    return response


def _reader(request: web.Request) -> Reader:
    return Reader(request.app[POOL], request.match_info["operation_id"], request[PRINCIPAL].user_id)


def _last_event_id(request: web.Request) -> int | None:
    """The ``Last-Event-ID`` header as a version; None when it is absent or not a version (a sign or over 18
    digits included), or sent more than once: repeated fields read as one list (RFC 9110, Field Order),
    which is no number.
    """
    values = request.headers.getall("Last-Event-ID", [])
    value = values[0] if len(values) == 1 else ""
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 18 else None


def _event(row: OperationView | None) -> bytes:
    """One event of the stream: the representation as an ``operation`` event, or a heartbeat comment."""
    if row is None:
        return b": heartbeat\n\n"
    return f"id: {row.version}\nevent: operation\ndata: {rendered_operation(row)}\n\n".encode()


async def list_operations(request: web.Request) -> web.Response:
    """``GET /v3/operations?state=&limit=&cursor=``: the caller's operations, newest first."""
    query = validate_query(OperationListQuery, request)
    after = decode_cursor(query.cursor)
    async with request.app[POOL].acquire() as conn:
        rows = await status_monitor.read_operations(
            conn,
            owner_id=request[PRINCIPAL].user_id,
            state=query.state.value if query.state else None,
            limit=query.limit + 1,
            after=after,
        )
    page, next_cursor = split_page(rows, limit=query.limit)
    body: dict[str, Any] = {"operations": [represent(row) for row in page], "next_cursor": next_cursor}
    return json_response(body, headers=NO_STORE)


async def cancel_operation(request: web.Request) -> web.Response:
    """``POST /v3/operations/{id}/cancel`` with the documented outcomes (docs/api.md: Operations, Cancel)."""
    await read_empty_input(request)
    operation_id = request.match_info["operation_id"]
    if not is_operation_id(operation_id):
        raise not_found()
    owner_id = request[PRINCIPAL].user_id
    async with request.app[POOL].acquire() as conn:
        # The cancel's span links to the export's trace; its wake-up carries that trace (docs/monitoring.md: Monitoring,
        # Traces). The lookup only with tracing on.
        export_trace = (
            await status_monitor.stored_traceparent(conn, operation_id=operation_id, owner_id=owner_id)
            if tracing.enabled()
            else None
        )
        with tracing.span("cancel operation", links=[export_trace], attributes={tracing.OPERATION_ID: operation_id}):
            async with conn.transaction():
                if await status_monitor.request_cancel(conn, operation_id=operation_id, owner_id=owner_id):
                    # A wake-up in the same transaction: a worker finishes a cancellation that no live worker
                    # holds at once, instead of a janitor pass later (docs/states.md: States and failure model,
                    # Cancel).
                    await enqueue_run(conn, operation_id=operation_id)
                else:
                    # A repeated cancel changes nothing, so its commit would not wait for the synchronous
                    # standbys, and the first one's may hold on the primary only (it answered 503): acknowledge
                    # neither before they hold it (docs/deploy.md: A primary with standbys).
                    await await_replication(conn)
                # Read in the transaction: a request that moved it sees its own CANCEL_REQUESTED.
                row = await status_monitor.read_operation(conn, operation_id=operation_id, owner_id=owner_id)
    if row is None:
        raise not_found()
    if row.state == State.CANCEL_REQUESTED:
        return operation_response(row, status=202, Location=path("getOperation", operation_id=operation_id))
    if row.state == State.CANCELED:
        return operation_response(row)
    raise ProblemError(
        "ALREADY_TERMINAL",
        f"The operation already ended as {row.state}; it can no longer be canceled.",
        state=row.state,
    )


# OpenAPI 3.2's convention, which schemathesis checks: the schema of one event; comments are not events.
_EVENT_SCHEMA = {
    "description": "One server-sent event; `: heartbeat` comments come between events.",
    "type": "object",
    "properties": {
        "event": {"const": "operation"},
        "id": {"type": "string", "pattern": "^[0-9]+$", "description": "The operation's version."},
        "data": {
            "type": "string",
            "description": "The `Operation` as one line of JSON.",
            "contentMediaType": JSON_MEDIA_TYPE,
            "contentSchema": ref(Operation),
        },
    },
    "required": ["event", "id", "data"],
}
_RETRY_AFTER = {"Retry-After": retry_after("Seconds before polling again, while not terminal.", required=False)}
_WAITING_PROBLEMS = ("NOT_FOUND", "VALIDATION_FAILED", "TOO_MANY_WAITERS")

ENDPOINTS = (
    page_endpoint(
        "listOperations",
        list_operations,
        "The caller's operations, newest first",
        tag="operations",
        query=OperationListQuery,
        page=OperationPage,
    ),
    Endpoint(
        route="getOperation",
        handler=get_operation,
        summary="The status monitor of an export",
        tag="operations",
        description="With `wait` (1-60 seconds) a long poll: answered as soon as the state differs from the one "
        "it had when the request arrived, at once when it is terminal, else after `wait` seconds; progress alone "
        "does not end it. The caller's waiting requests are capped: 429 `TOO_MANY_WAITERS` beyond. With "
        "`If-None-Match` naming the current version: 304; with `wait` too, the wait starts only if it names the "
        "version on arrival, and ends in 304 unless the version moved meanwhile.",
        query=OperationQuery,
        parameters=(
            header_parameter(
                "If-None-Match",
                "Entity-tags from earlier answers (or `*`): 304 while one names the current version (weakly).",
            ),
        ),
        answers=(
            operation_answer(200, "The operation's current representation.", _RETRY_AFTER),
            Answer(
                304,
                "`If-None-Match` names the current version: the representation held is current.",
                headers={"Cache-Control": NO_STORE_HEADER, "ETag": OPERATION_ETAG_HEADER, **_RETRY_AFTER},
            ),
        ),
        problems=_WAITING_PROBLEMS,
    ),
    Endpoint(
        route="streamOperationEvents",
        handler=stream_operation_events,
        summary="The operation's changes as server-sent events",
        tag="operations",
        description="The representation on connect (unless `Last-Event-ID` is its current version) and on every "
        "change, progress at most twice a second, until a terminal state: the stream sends it, then ends. A "
        "wake-up hint: `getOperation` stays the source of truth.",
        parameters=(
            header_parameter(
                "Last-Event-ID",
                "The `id` of the last event received. Only the current version holds back the representation on "
                "connect; any other value (older, above the current version, negative, not a number) gets it at "
                "once.",
            ),
        ),
        answers=(
            Answer(
                200,
                "The event stream.",
                content={EVENT_STREAM: {"schema": _EVENT_SCHEMA}},
                headers={"Cache-Control": NO_STORE_HEADER},
            ),
            Answer(
                204,
                "The operation is terminal and `Last-Event-ID` is its version: nothing more will come (this stops "
                "an `EventSource` from reconnecting).",
                headers={"Cache-Control": NO_STORE_HEADER},
            ),
        ),
        problems=_WAITING_PROBLEMS,
    ),
    Endpoint(
        route="cancelOperation",
        handler=cancel_operation,
        summary="Request cancellation of an export",
        tag="operations",
        description="Idempotent. After SUCCEEDED, FAILED, FAILED_REPAIR or EXPIRED: 409 `ALREADY_TERMINAL` with "
        "the `state`.",
        body=Body(EmptyRequest, "Empty, or `{}`.", required=False),
        answers=(
            operation_answer(200, "Already CANCELED."),
            operation_answer(
                202,
                "CANCEL_REQUESTED is stored; the worker or the janitor finishes the cancellation.",
                {
                    "Location": LOCATION_HEADER,
                    "Retry-After": retry_after("Seconds before polling again.", required=True),
                },
            ),
        ),
        problems=(*JSON_BODY_PROBLEMS, "NOT_FOUND", "ALREADY_TERMINAL"),
    ),
)
