"""The status monitor: ``/v3/operations`` and ``/v3/operations/{id}`` (README: API reference, Operation; States and
failure model, Cancel)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from services.api.bodies import read_model, validate_query
from services.api.keys import POOL, PRINCIPAL, SETTINGS
from services.api.pagination import decode_cursor, split_page
from services.api.problems import Problem, not_found
from services.api.representation import operation_url, represent
from services.api.responses import NO_STORE, json_response, operation_response
from services.api.schemas import EmptyRequest, OperationListQuery
from shared.ids import is_operation_id
from shared.repository import operations
from shared.repository.outbox import enqueue_run
from shared.states import State


async def get_operation(request: web.Request) -> web.Response:
    """``GET /v3/operations/{id}``: the owner's view; anyone else the same 404 as for a missing id."""
    operation_id = request.match_info["operation_id"]
    if not is_operation_id(operation_id):
        raise not_found()
    async with request.app[POOL].acquire() as conn:
        row = await operations.get_operation(conn, operation_id=operation_id, owner_id=request[PRINCIPAL].user_id)
    if row is None:
        raise not_found()
    return operation_response(row)


async def list_operations(request: web.Request) -> web.Response:
    """``GET /v3/operations?state=&limit=&cursor=``: the caller's operations, newest first."""
    query = validate_query(OperationListQuery, request)
    after = decode_cursor(query.cursor)
    async with request.app[POOL].acquire() as conn:
        rows = await operations.list_operations(
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
    """``POST /v3/operations/{id}/cancel`` with the documented outcomes (README: API reference, Cancel)."""
    await read_model(request, EmptyRequest, max_bytes=request.app[SETTINGS].export_request_max_bytes, allow_empty=True)
    operation_id = request.match_info["operation_id"]
    if not is_operation_id(operation_id):
        raise not_found()
    owner_id = request[PRINCIPAL].user_id
    async with request.app[POOL].acquire() as conn, conn.transaction():
        if await operations.request_cancel(conn, operation_id=operation_id, owner_id=owner_id):
            # A wake-up in the same transaction: a worker finishes a cancellation that no live worker
            # holds at once, instead of a janitor pass later (README: States and failure model, Cancel).
            await enqueue_run(conn, operation_id=operation_id)
        # Read in the transaction: a request that moved it sees its own CANCEL_REQUESTED.
        row = await operations.get_operation(conn, operation_id=operation_id, owner_id=owner_id)
    if row is None:
        raise not_found()
    if row["state"] == State.CANCEL_REQUESTED:
        return operation_response(row, status=202, Location=operation_url(operation_id))
    if row["state"] == State.CANCELED:
        return operation_response(row)
    raise Problem(
        "ALREADY_TERMINAL",
        f"The operation already ended as {row['state']}; it can no longer be canceled.",
        state=row["state"],
    )
