"""The scheduler's side of the ``export_schedules`` table (docs/schedules.md: Scheduled exports): finding the
schedules whose next run is due, firing one (creating its run, an ordinary export operation keyed by the
schedule and the due time, at most once by the database's unique constraint whoever fires), and the
scheduler's figures. The owner's side is ``shared.repository.schedules``. Every function runs on the caller's
connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

import asyncpg

from shared.export.cadence import Cadence
from shared.repository.submissions import SubmitOutcome, create_run
from shared.states import ACTIVE, PauseReason, WaitingReason, values

_ACTIVE_STATES = values(ACTIVE)


# An ACTIVE schedule whose next run is due and that has no unfinished run: the scheduler's work. One with an
# unfinished run waits for it, its missed due times to be coalesced (docs/schedules.md: Runs).
# A run not ended of the schedule named by {schedule}, the unended states passed as $1.
_UNFINISHED_RUN_OF = "SELECT 1 FROM operations o WHERE o.schedule_id = {schedule} AND o.state = ANY($1::text[])"
_DUE = f"""
    FROM export_schedules s
    WHERE s.state = 'ACTIVE' AND s.next_run_at <= now()
      AND NOT EXISTS ({_UNFINISHED_RUN_OF.format(schedule="s.schedule_id")})
"""
_HAS_UNFINISHED_RUN = f"SELECT EXISTS ({_UNFINISHED_RUN_OF.format(schedule='$2')})"


@dataclass(frozen=True)
class DueSchedule:
    """A schedule due to fire: its id and since when it is due; also a page's keyset position. ``traceparent``:
    the trace context of its creation (None when tracing was off), which its fire spans link to.
    """

    schedule_id: str
    next_run_at: datetime
    traceparent: str | None = None


async def due_schedules(conn: asyncpg.Connection, *, limit: int, after: DueSchedule | None = None) -> list[DueSchedule]:
    """Up to ``limit`` schedules due to fire, the longest overdue first (ties by id), after ``after`` (the last of
    the page before) when given. A walk over the pages reaches every due schedule, however many wait for their
    owners' quota at the head of the order.
    """
    rows = await conn.fetch(
        f"""
        SELECT s.schedule_id, s.next_run_at, s.traceparent {_DUE}
          AND (s.next_run_at, s.schedule_id) > ($3::timestamptz, $4::text)
        ORDER BY s.next_run_at, s.schedule_id LIMIT $2
        """,
        _ACTIVE_STATES,
        limit,
        after.next_run_at if after else datetime.min.replace(tzinfo=UTC),
        after.schedule_id if after else "",
    )
    return [DueSchedule(row["schedule_id"], row["next_run_at"], row["traceparent"]) for row in rows]


class FireOutcome(StrEnum):
    """What firing a schedule did (docs/schedules.md: Runs)."""

    CREATED = "created"
    # Not ACTIVE, deleted, its next run not due yet (another firing part got there first), or a run of it is
    # unfinished: its due times wait, to be coalesced into one run once it ends.
    NOT_DUE = "not_due"
    WAITING_FOR_QUOTA = "waiting_for_quota"
    ACCESS_REVOKED = "access_revoked"
    # A run for this due time exists already: the unique constraint refused a second one.
    DUPLICATE = "duplicate"


@dataclass(frozen=True)
class FireResult:
    """A fire's ``outcome``; ``due_at`` the due time it was for, and ``operation_id`` the run it created (CREATED)."""

    outcome: FireOutcome
    due_at: datetime | None = None
    operation_id: str | None = None


async def fire(
    conn: asyncpg.Connection, *, schedule_id: str, operation_id: str, max_active: int, traceparent: str | None = None
) -> FireResult:
    """Create the schedule's run as ``operation_id`` if it is due, in one transaction: the schedule row locked,
    then the run created as a submit creates an export (``submissions.create_run``: membership, else the
    schedule pauses with ACCESS_REVOKED; the owner's active exports under the submit's per-user lock: at
    ``max_active`` the run waits, the schedule showing why; then the operation and its outbox row). The run is
    keyed by the latest due time at or before now, every missed one coalesced into it; the next run is due at
    the first due time after now. Safe to call from several processes at once, and after a pause in the middle
    (a frozen process): the row lock orders them, and the unique (schedule_id, due_at) refuses a second run for
    one due time. The run is stored with ``traceparent`` (the fire's span; docs/monitoring.md: Monitoring,
    Traces).
    """
    async with conn.transaction():
        # The clock as this statement runs, after its snapshot, not the transaction's start: a run's created_at
        # follows the end of every run it saw finished, even when this process froze between BEGIN and here.
        # An incremental schedule's run starts at its watermark.
        row = await conn.fetchrow(
            "SELECT clock_timestamp() AS now, s.every, s.start_at, s.owner_id, s.conversation_id,"
            " CASE s.mode WHEN 'incremental' THEN s.request || jsonb_build_object('after_seq', s.watermark)"
            " ELSE s.request END::text AS run_request"
            f" {_DUE} AND s.schedule_id = $2 FOR UPDATE OF s",
            _ACTIVE_STATES,
            schedule_id,
        )
        if row is None:
            return FireResult(FireOutcome.NOT_DUE)
        # The lock may have waited for another fire's commit, whose run that statement's snapshot could not
        # see (READ COMMITTED re-checks only the locked row): a new statement sees it, and the due time waits.
        if await conn.fetchval(_HAS_UNFINISHED_RUN, _ACTIVE_STATES, schedule_id):
            return FireResult(FireOutcome.NOT_DUE)
        every, now = Cadence.parse(row["every"]), row["now"]
        # Due, so the anchor has passed: there is a latest due time.
        due_at = every.latest_due(row["start_at"], now) or row["start_at"]
        run = await create_run(
            conn,
            operation_id=operation_id,
            owner_id=row["owner_id"],
            conversation_id=row["conversation_id"],
            request_json=row["run_request"],
            max_active=max_active,
            schedule_id=schedule_id,
            due_at=due_at,
            created_at=now,
            traceparent=traceparent,
        )
        match run.outcome:
            case SubmitOutcome.NOT_MEMBER:
                await conn.execute(
                    "SELECT pause_export_schedule($1, $2)", schedule_id, PauseReason.ACCESS_REVOKED.value
                )
                return FireResult(FireOutcome.ACCESS_REVOKED, due_at)
            case SubmitOutcome.QUOTA:
                await _set_waiting(conn, schedule_id, WaitingReason.ACTIVE_EXPORT_QUOTA)
                return FireResult(FireOutcome.WAITING_FOR_QUOTA, due_at)
        created = run.outcome is SubmitOutcome.CREATED
        await conn.execute(
            """
            UPDATE export_schedules SET next_run_at = $2, waiting_reason = NULL,
                last_operation_id = coalesce($3, last_operation_id), version = version + 1, updated_at = now()
            WHERE schedule_id = $1
            """,
            schedule_id,
            every.next_due(row["start_at"], now),
            operation_id if created else None,
        )
    if not created:
        return FireResult(FireOutcome.DUPLICATE, due_at)
    return FireResult(FireOutcome.CREATED, due_at, operation_id)


async def _set_waiting(conn: asyncpg.Connection, schedule_id: str, reason: WaitingReason) -> None:
    await conn.execute(
        """
        UPDATE export_schedules SET waiting_reason = $2, version = version + 1, updated_at = now()
        WHERE schedule_id = $1 AND waiting_reason IS DISTINCT FROM $2
        """,
        schedule_id,
        reason.value,
    )


@dataclass(frozen=True)
class ScheduleFigures:
    """What the scheduler's gauges show: schedules by state (``"ACTIVE"``, ``"PAUSED"``, and ``"WAITING"`` for
    those whose run waits for the quota) and how long, in seconds, the longest-overdue due schedule not waiting
    for the quota has been due (0 when none is): the firing part's lag, not an owner's.
    """

    by_state: dict[str, int]
    oldest_due_lag_seconds: float


async def schedule_figures(conn: asyncpg.Connection) -> ScheduleFigures:
    """Read the figures in one round trip."""
    row = await conn.fetchrow(
        f"""
        SELECT (SELECT count(*) FROM export_schedules WHERE state = 'ACTIVE') AS active,
               (SELECT count(*) FROM export_schedules WHERE state = 'PAUSED') AS paused,
               (SELECT count(*) FROM export_schedules WHERE waiting_reason IS NOT NULL) AS waiting,
               (SELECT coalesce(extract(epoch FROM now() - min(s.next_run_at))::float8, 0) {_DUE}
                  AND s.waiting_reason IS NULL) AS lag
        """,
        _ACTIVE_STATES,
    )
    return ScheduleFigures(
        {"ACTIVE": row["active"], "PAUSED": row["paused"], "WAITING": row["waiting"]}, max(0.0, row["lag"])
    )
