"""Creating, resuming and reading export schedules (docs/api.md: Export schedules): what the body may ask for,
the one transaction that creates a schedule (``shared.repository.schedules``), and how each outcome is answered,
in the submit's order and with the submit's codes where they mean the same.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import assert_never

import asyncpg

from services.api.exporting.outcomes import SCHEDULE, answer
from services.api.http.problems import ProblemError, not_found
from services.api.http.schemas import ExportScheduleSubmission
from shared import tracing
from shared.db import await_replication
from shared.export.cadence import Cadence, CadenceError
from shared.export.fingerprint import schedule_fingerprint
from shared.export.request import ExportRequest
from shared.ids import is_operation_id, new_schedule_id
from shared.repository import schedules
from shared.repository.schedules import ResumeOutcome, ScheduleView
from shared.settings import ApiPartSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AcceptedSchedule:
    """The schedule a creation is answered with (201), and whether it was a replay of an earlier one."""

    schedule_id: str
    replayed: bool


def checked_interval(body: ExportScheduleSubmission, settings: ApiPartSettings) -> Cadence:
    """The body's interval, once no option is refused and the interval is one (docs/api.md: Export schedules).

    Raises ``ProblemError`` 422, in this order: SCHEDULE_OPTION_REFUSED (``before_seq`` or ``until`` given),
    SCHEDULE_INTERVAL_INVALID (not a duration ``shared.export.cadence`` reads), SCHEDULE_INTERVAL_TOO_SHORT (shorter
    than ``schedule_min_interval_seconds``, a month counted as its shortest).
    """
    refused = body.refused_options()
    if refused:
        raise ProblemError(
            "SCHEDULE_OPTION_REFUSED",
            f"A schedule takes no {' or '.join(refused)}: every run after the first would be empty.",
            errors=[{"loc": ["body", name], "msg": "not taken by a schedule"} for name in refused],
        )
    try:
        every = Cadence.parse(body.every)
    except CadenceError as exc:
        # In words of its own: the parser's message quotes the input, which a problem never echoes.
        raise _interval_problem(
            exc.code,
            "every is not a usable interval.",
            "must be an ISO 8601 duration of whole units (P1D, PT6H, P1M), longer than zero and at most a thousand"
            " years",
        ) from None
    minimum = settings.schedule_min_interval_seconds
    if every.min_seconds < minimum:
        raise _interval_problem(
            "SCHEDULE_INTERVAL_TOO_SHORT",
            f"every must be at least {minimum} seconds (CHATEXPORT_SCHEDULE_MIN_INTERVAL_SECONDS).",
            f"must be at least {minimum} seconds",
        )
    return every


def _interval_problem(code: str, detail: str, msg: str) -> ProblemError:
    return ProblemError(code, detail, errors=[{"loc": ["body", "every"], "msg": msg}])


async def create(
    conn: asyncpg.Connection,
    settings: ApiPartSettings,
    *,
    owner_id: str,
    conversation_id: str,
    idempotency_key: str,
    body: ExportScheduleSubmission,
    every: Cadence,
    request: ExportRequest,
) -> AcceptedSchedule:
    """Create the schedule of ``body`` (``every`` from ``checked_interval``, ``request`` the body's export request),
    or find the one this key already created; commits at once (one statement).

    Raises ``ProblemError`` NOT_FOUND (not a member, or no such conversation), IDEMPOTENCY_KEY_REUSED (also for a
    key an export submit used) / IDEMPOTENCY_KEY_EXPIRED (409) or TOO_MANY_SCHEDULES (409). ``conn`` comes from
    the API's pool, which refuses a commit the synchronous standbys may lack when it is released (docs/deploy.md:
    A primary with standbys).
    """
    schedule_id = new_schedule_id()
    tracing.set_attributes(**{tracing.SCHEDULE_ID: schedule_id})
    result = await schedules.create_schedule(
        conn,
        schedule_id=schedule_id,
        owner_id=owner_id,
        conversation_id=conversation_id,
        idempotency_key=idempotency_key,
        fingerprint=schedule_fingerprint(
            user_id=owner_id,
            conversation_id=conversation_id,
            request=request,
            every=every.text,
            start_at=body.start_at,
            mode=body.mode,
        ),
        every=every,
        start_at=body.start_at,
        mode=body.mode,
        request=request,
        replay_window_seconds=settings.idempotency_replay_window_seconds,
        traceparent=tracing.current_traceparent(),
        max_schedules=settings.max_schedules_per_user,
    )
    replayed = answer(result.outcome, SCHEDULE, settings)
    assert result.schedule_id is not None
    if replayed:
        # As a submit's replay: answered only once the synchronous standbys hold the schedule.
        await await_replication(conn)
    else:
        created = {"schedule_id": result.schedule_id, "conversation_id": conversation_id}
        log.info("export schedule created", extra=created)
    return AcceptedSchedule(result.schedule_id, replayed=replayed)


async def read_or_404(conn: asyncpg.Connection, *, schedule_id: str, owner_id: str) -> ScheduleView:
    """The schedule, or ``ProblemError`` NOT_FOUND when it does not exist or is not ``owner_id``'s (one answer
    for both; an id that cannot be one is not looked up).
    """
    if not is_id(schedule_id):
        raise not_found()
    view = await schedules.read_schedule(conn, schedule_id=schedule_id, owner_id=owner_id)
    if view is None:
        raise not_found()
    return view


def is_id(schedule_id: str) -> bool:
    """True when ``schedule_id`` could be a schedule's id: it has an operation id's syntax (``shared.ids``)."""
    return is_operation_id(schedule_id)


async def pause(conn: asyncpg.Connection, *, schedule_id: str, owner_id: str) -> ScheduleView:
    """Pause the schedule (idempotent; a schedule paused for ACCESS_REVOKED keeps its reason) and return it as it
    is then; raises ``ProblemError`` NOT_FOUND.
    """
    if not is_id(schedule_id):
        raise not_found()
    async with conn.transaction():
        view = await schedules.pause(conn, schedule_id=schedule_id, owner_id=owner_id)
        await _acknowledged(conn)
    if view is None:
        raise not_found()
    return view


async def resume(conn: asyncpg.Connection, *, schedule_id: str, owner_id: str) -> ScheduleView:
    """Resume the schedule (idempotent on an ACTIVE one) and return it as it is then.

    Raises ``ProblemError`` NOT_FOUND, SCHEDULE_NEEDS_REPAIR (422, a run is FAILED_REPAIR) or ACCESS_REVOKED
    (403, the owner is no longer a member of the conversation).
    """
    if not is_id(schedule_id):
        raise not_found()
    async with conn.transaction():
        result = await schedules.resume(conn, schedule_id=schedule_id, owner_id=owner_id)
        await _acknowledged(conn)
    match result.outcome:
        case ResumeOutcome.RESUMED:
            assert result.schedule is not None
            return result.schedule
        case ResumeOutcome.NOT_FOUND:
            raise not_found()
        case ResumeOutcome.NEEDS_REPAIR:
            raise ProblemError(
                "SCHEDULE_NEEDS_REPAIR",
                "A run of this schedule waits for an operator (FAILED_REPAIR); the schedule resumes once it is "
                "repaired.",
            )
        case ResumeOutcome.NOT_MEMBER:
            raise ProblemError("ACCESS_REVOKED", "You are no longer a member of this conversation.")
        case _:
            assert_never(result.outcome)


async def _acknowledged(conn: asyncpg.Connection) -> None:
    # A repeated pause or resume changes nothing, so its commit would not wait for the synchronous standbys,
    # and the first one's may hold on the primary only (it answered 503): acknowledge neither before they
    # hold it (docs/deploy.md: A primary with standbys).
    await await_replication(conn)
