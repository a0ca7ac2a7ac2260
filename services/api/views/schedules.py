"""Export schedules: ``/v3/conversations/{cid}/export-schedules`` and ``/v3/export-schedules[/{id}[/runs|/pause|
/resume]]`` (docs/api.md: Export schedules). Only the owner sees a schedule; anyone else gets the same 404 as
for one that does not exist.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from services.api.exporting import scheduling
from services.api.exporting.outcomes import SCHEDULE
from services.api.http.bodies import JSON_BODY_PROBLEMS, read_empty_input, read_model, validate_query
from services.api.http.contract import NO_STORE_HEADER, Answer, Body, Endpoint, header
from services.api.http.idempotency import KEY_PROBLEMS, parse_idempotency_key
from services.api.http.keys import POOL, PRINCIPAL, SETTINGS
from services.api.http.pagination import Keyset, decode_cursor, page_endpoint, split_keyset_page
from services.api.http.problems import not_found
from services.api.http.responses import NO_STORE, json_response
from services.api.http.schemas import (
    EmptyQuery,
    EmptyRequest,
    ExportScheduleSubmission,
    Schedule,
    SchedulePage,
    SchedulePageQuery,
    ScheduleRunPage,
)
from services.api.views.exports import IDEMPOTENCY_KEY_PARAMETER, checked_notify_url
from shared.ids import OPERATION_ID_PATTERN
from shared.repository import schedules
from shared.repository.operation_view import OperationView
from shared.repository.schedules import ScheduleView
from shared.representation import represent, represent_schedule
from shared.routes import path


async def create_export_schedule(request: web.Request) -> web.Response:
    """``POST /v3/conversations/{cid}/export-schedules``: checks in the submit's order (docs/api.md: Export
    schedules), then 201 with the schedule, also on a replay.
    """
    validate_query(EmptyQuery, request)
    settings = request.app[SETTINGS]
    owner_id = request[PRINCIPAL].user_id
    key = parse_idempotency_key(request.headers)
    body = await read_model(request, ExportScheduleSubmission, max_bytes=settings.export_request_max_bytes)
    every = scheduling.checked_interval(body, settings)
    notify_url = None if body.notify is None else checked_notify_url(body.notify.url, settings)
    async with request.app[POOL].acquire() as conn:
        created = await scheduling.create(
            conn,
            settings,
            owner_id=owner_id,
            conversation_id=request.match_info["cid"],
            idempotency_key=key,
            body=body,
            every=every,
            request=body.export_request(notify_url=notify_url),
        )
        # Read after COMMIT: a replay shows the schedule as it is now.
        view = await scheduling.read_or_404(conn, schedule_id=created.schedule_id, owner_id=owner_id)
    headers = {"Location": path("getExportSchedule", schedule_id=view.schedule_id)}
    if created.replayed:
        headers["Idempotent-Replayed"] = "true"
    return _schedule_response(view, status=201, **headers)


async def list_export_schedules(request: web.Request) -> web.Response:
    """``GET /v3/export-schedules?limit=&cursor=``: the caller's schedules, newest first."""
    query = validate_query(SchedulePageQuery, request)
    after = decode_cursor(query.cursor)
    async with request.app[POOL].acquire() as conn:
        views = await schedules.read_schedules(
            conn, owner_id=request[PRINCIPAL].user_id, limit=query.limit + 1, after=after
        )
    page, token = split_keyset_page(views, limit=query.limit, keyset=lambda view: (view.created_at, view.schedule_id))
    body: dict[str, Any] = {"schedules": [represent_schedule(view) for view in page], "next_cursor": token}
    return json_response(body, headers=NO_STORE)


async def get_export_schedule(request: web.Request) -> web.Response:
    """``GET /v3/export-schedules/{id}``: the owner's schedule; anyone else the same 404 as for a missing id."""
    validate_query(EmptyQuery, request)
    schedule_id, owner_id = _target(request)
    async with request.app[POOL].acquire() as conn:
        view = await scheduling.read_or_404(conn, schedule_id=schedule_id, owner_id=owner_id)
    return _schedule_response(view)


async def list_export_schedule_runs(request: web.Request) -> web.Response:
    """``GET /v3/export-schedules/{id}/runs?limit=&cursor=``: the schedule's runs, newest due time first, as
    operations; a schedule that is not the caller's is the same 404 as a missing one.
    """
    query = validate_query(SchedulePageQuery, request)
    after = decode_cursor(query.cursor)
    schedule_id, owner_id = _target(request)
    if not scheduling.is_id(schedule_id):
        raise not_found()
    async with request.app[POOL].acquire() as conn:
        rows = await schedules.read_runs(
            conn, schedule_id=schedule_id, owner_id=owner_id, limit=query.limit + 1, after=after
        )
    if rows is None:
        raise not_found()
    page, token = split_keyset_page(rows, limit=query.limit, keyset=_run_keyset)
    body: dict[str, Any] = {"operations": [represent(row) for row in page], "next_cursor": token}
    return json_response(body, headers=NO_STORE)


def _run_keyset(row: OperationView) -> Keyset:
    """A run's place in its schedule's list: (due time, operation id)."""
    assert row.due_at is not None  # every run has its due time (migration 0013)
    return row.due_at, row.operation_id


async def pause_export_schedule(request: web.Request) -> web.Response:
    """``POST /v3/export-schedules/{id}/pause``: PAUSED (reason USER, unless the system paused it already)."""
    return await _change_state(request, scheduling.pause)


async def resume_export_schedule(request: web.Request) -> web.Response:
    """``POST /v3/export-schedules/{id}/resume``: ACTIVE, its next run at the next due time (docs/api.md: Export
    schedules).
    """
    return await _change_state(request, scheduling.resume)


async def _change_state(request: web.Request, change: Callable[..., Awaitable[ScheduleView]]) -> web.Response:
    """A pause or a resume: an empty body, the caller's own schedule, its representation after ``change``."""
    await read_empty_input(request)
    schedule_id, owner_id = _target(request)
    async with request.app[POOL].acquire() as conn:
        view = await change(conn, schedule_id=schedule_id, owner_id=owner_id)
    return _schedule_response(view)


async def delete_export_schedule(request: web.Request) -> web.Response:
    """``DELETE /v3/export-schedules/{id}``: 204; a run in flight finishes and every run's result stays to its
    retention.
    """
    validate_query(EmptyQuery, request)
    schedule_id, owner_id = _target(request)
    if not scheduling.is_id(schedule_id):
        raise not_found()
    async with request.app[POOL].acquire() as conn:
        deleted = await schedules.delete(conn, schedule_id=schedule_id, owner_id=owner_id)
    if not deleted:
        raise not_found()
    return web.Response(status=204)


def _target(request: web.Request) -> tuple[str, str]:
    """(the schedule id the path names, the caller's user id)."""
    return request.match_info["schedule_id"], request[PRINCIPAL].user_id


def _schedule_response(view: ScheduleView, *, status: int = 200, **headers: str) -> web.Response:
    """The schedule as JSON, never cached: its next run and its last run change."""
    return json_response(represent_schedule(view), status=status, headers={**NO_STORE, **headers})


def _schedule_answer(status: int, description: str, headers: dict[str, Any] | None = None) -> Answer:
    """The contract of a ``_schedule_response``."""
    return Answer(status, description, Schedule, headers={"Cache-Control": NO_STORE_HEADER, **(headers or {})})


_SCHEDULE_LOCATION = header(
    "The schedule.",
    {"type": "string", "pattern": f"^{path('getExportSchedule', schedule_id=OPERATION_ID_PATTERN)}$"},
    required=True,
)

ENDPOINTS = (
    Endpoint(
        route="createExportSchedule",
        handler=create_export_schedule,
        summary="Schedule exports of a conversation",
        tag="schedules",
        description="Checks in the submit's order: token, query (none is taken), Idempotency-Key, body "
        "(`before_seq` and `until` are refused, `every` must be an ISO 8601 duration of at least "
        "`CHATEXPORT_SCHEDULE_MIN_INTERVAL_SECONDS`, a month counted as 28 days), membership, idempotency (a key "
        "an export submit used is reused here), then "
        "the limit of `CHATEXPORT_MAX_SCHEDULES_PER_USER` schedules. The body is at most "
        "`CHATEXPORT_EXPORT_REQUEST_MAX_BYTES` bytes, as a submit's. The first run is due at `start_at` (by "
        "default the creation), then every `every` from it; each run is an export operation with the schedule's "
        "options, an incremental one starting after the chain's watermark.",
        parameters=(IDEMPOTENCY_KEY_PARAMETER,),
        body=Body(ExportScheduleSubmission, "The interval, its anchor and mode, and every run's export options."),
        answers=(
            _schedule_answer(
                201,
                "The schedule is stored (or this is a replay): its current representation.",
                {
                    "Location": _SCHEDULE_LOCATION,
                    "Idempotent-Replayed": header("Present on a replay.", {"const": "true"}),
                },
            ),
        ),
        problems=(
            *KEY_PROBLEMS,
            *JSON_BODY_PROBLEMS,
            "SCHEDULE_OPTION_REFUSED",
            "SCHEDULE_INTERVAL_INVALID",
            "SCHEDULE_INTERVAL_TOO_SHORT",
            "NOTIFY_URL_REFUSED",
            *SCHEDULE.problems,
        ),
    ),
    page_endpoint(
        "listExportSchedules",
        list_export_schedules,
        "The caller's export schedules, newest first",
        tag="schedules",
        query=SchedulePageQuery,
        page=SchedulePage,
    ),
    Endpoint(
        route="getExportSchedule",
        handler=get_export_schedule,
        summary="An export schedule",
        tag="schedules",
        answers=(_schedule_answer(200, "The schedule's current representation."),),
        problems=("VALIDATION_FAILED", "NOT_FOUND"),
    ),
    Endpoint(
        route="deleteExportSchedule",
        handler=delete_export_schedule,
        summary="Delete an export schedule",
        tag="schedules",
        description="No run is created after it. A run in flight finishes, and every run's result stays to its "
        "retention.",
        answers=(Answer(204, "Deleted."),),
        problems=("VALIDATION_FAILED", "NOT_FOUND"),
    ),
    page_endpoint(
        "listExportScheduleRuns",
        list_export_schedule_runs,
        "A schedule's runs, newest due time first",
        tag="schedules",
        query=SchedulePageQuery,
        page=ScheduleRunPage,
        problems=("NOT_FOUND",),
    ),
    Endpoint(
        route="pauseExportSchedule",
        handler=pause_export_schedule,
        summary="Pause an export schedule",
        tag="schedules",
        description="Idempotent. No run is created while it is PAUSED; a run in flight finishes. The reason becomes "
        "`USER`, also over `RUN_NEEDS_REPAIR` (the run's repair then does not resume it); one paused for "
        "`ACCESS_REVOKED` keeps its reason.",
        body=Body(EmptyRequest, "Empty, or `{}`.", required=False),
        answers=(_schedule_answer(200, "The schedule, PAUSED."),),
        problems=(*JSON_BODY_PROBLEMS, "NOT_FOUND"),
    ),
    Endpoint(
        route="resumeExportSchedule",
        handler=resume_export_schedule,
        summary="Resume an export schedule",
        tag="schedules",
        description="Idempotent on an ACTIVE schedule. The next run is at the first due time after now; the due "
        "times missed while PAUSED are not run. Refused while a run is FAILED_REPAIR (an operator's requeue "
        "resumes it) and when the owner is no longer a member of the conversation.",
        body=Body(EmptyRequest, "Empty, or `{}`.", required=False),
        answers=(_schedule_answer(200, "The schedule, ACTIVE."),),
        problems=(*JSON_BODY_PROBLEMS, "NOT_FOUND", "SCHEDULE_NEEDS_REPAIR", "ACCESS_REVOKED"),
    ),
)
