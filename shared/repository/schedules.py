"""The ``export_schedules`` table, and the runs it creates (docs/schedules.md: Scheduled exports).

The owner's side creates, reads, pauses, resumes and deletes a schedule; the scheduler's side finds due
schedules and fires one: creating its run, an ordinary export operation keyed by the schedule and the due
time, at most once by the database's unique constraint whoever fires. What a run's end does to its schedule
(the chain's watermark, a pause) is the trigger of migration 0013, in the transaction that ends the run.
Every function runs on the caller's connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import asyncpg

from shared.export.cadence import Cadence
from shared.export.request import FIELDS, ExportRequest
from shared.ids import is_valid_id
from shared.repository.message_store import is_member
from shared.repository.operation_view import REPRESENTATION_COLUMNS, REPRESENTATION_VIEW, OperationView, select_list
from shared.repository.submissions import SubmitOutcome
from shared.states import ACTIVE, PauseReason, ScheduleState, WaitingReason, values

_ACTIVE_STATES = values(ACTIVE)


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """One schedule as its owner sees it: ``request`` is every run's export request (an incremental run
    starts at ``watermark`` instead of ``request.after_seq``), ``every`` the interval, ``start_at`` its anchor;
    ``next_run_at`` is None while PAUSED; ``last_run_*`` describe the run created last (None before the first,
    or once it was purged). Times are aware datetimes.
    """

    schedule_id: str
    owner_id: str
    conversation_id: str
    every: Cadence
    start_at: datetime
    mode: str
    request: ExportRequest
    state: ScheduleState
    paused_reason: PauseReason | None
    waiting_reason: WaitingReason | None
    next_run_at: datetime | None
    watermark: int
    last_operation_id: str | None
    last_run_due_at: datetime | None
    last_run_state: str | None
    version: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> ScheduleView:
        """Build from a row of ``_SELECT_VIEW``."""
        return cls(
            schedule_id=row["schedule_id"],
            owner_id=row["owner_id"],
            conversation_id=row["conversation_id"],
            every=Cadence.parse(row["every"]),
            start_at=row["start_at"],
            mode=row["mode"],
            request=ExportRequest.from_row(row),
            state=ScheduleState(row["state"]),
            paused_reason=None if row["paused_reason"] is None else PauseReason(row["paused_reason"]),
            waiting_reason=None if row["waiting_reason"] is None else WaitingReason(row["waiting_reason"]),
            next_run_at=row["next_run_at"],
            watermark=row["watermark"],
            last_operation_id=row["last_operation_id"],
            last_run_due_at=row["last_run_due_at"],
            last_run_state=row["last_run_state"],
            version=row["version"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True)
class CreateResult:
    """What ``create_schedule`` decided, as a submit's outcome (``QUOTA``: the per-user limit of schedules), and the
    schedule it concerns: the new or replayed one, None otherwise.
    """

    outcome: SubmitOutcome
    schedule_id: str | None


# The request's fields as columns, read from the stored JSON object as ``operations`` types them.
_REQUEST_COLUMNS = ", ".join(f"r.{name}" for name in FIELDS)
_SELECT_VIEW = f"""
    SELECT s.*, {_REQUEST_COLUMNS}, o.due_at AS last_run_due_at, o.state AS last_run_state
    FROM export_schedules s
    CROSS JOIN LATERAL jsonb_populate_record(NULL::operations, s.request) r
    LEFT JOIN operations o ON o.operation_id = s.last_operation_id
"""


async def create_schedule(
    conn: asyncpg.Connection,
    *,
    schedule_id: str,
    owner_id: str,
    conversation_id: str,
    idempotency_key: str,
    fingerprint: str,
    every: Cadence,
    start_at: datetime | None,
    mode: str,
    request: ExportRequest,
    replay_window_seconds: int,
    max_schedules: int,
    traceparent: str | None = None,
) -> CreateResult:
    """Create ``schedule_id`` unless membership, an earlier use of ``idempotency_key`` (the submit's key space)
    or the limit of ``max_schedules`` decides otherwise (the server-side ``create_export_schedule_v2``, migration
    0020, which claims the key as a submit does).
    ``start_at`` None anchors the schedule at its creation (the database's clock); its first run is due at the
    anchor. ``request.before_seq`` and ``request.until`` must be None (the caller refuses them). A conversation id
    that breaks the id syntax is ``NOT_MEMBER`` without a query, as for a submit. A created schedule is stored
    with ``traceparent`` (the creating request's span), in the same statement.
    """
    if not is_valid_id(conversation_id):
        return CreateResult(SubmitOutcome.NOT_MEMBER, None)
    row = await conn.fetchrow(
        "SELECT outcome::text, schedule_id"
        " FROM create_export_schedule_v2($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        schedule_id,
        owner_id,
        conversation_id,
        idempotency_key,
        fingerprint,
        float(replay_window_seconds),
        max_schedules,
        every.text,
        start_at,
        mode,
        request.as_json(),
        traceparent,
    )
    return CreateResult(SubmitOutcome(row["outcome"]), row["schedule_id"])


async def read_schedule(conn: asyncpg.Connection, *, schedule_id: str, owner_id: str) -> ScheduleView | None:
    """The schedule if it exists AND belongs to ``owner_id`` (one answer for both); None otherwise."""
    row = await conn.fetchrow(_SELECT_VIEW + " WHERE s.schedule_id = $1 AND s.owner_id = $2", schedule_id, owner_id)
    return None if row is None else ScheduleView.from_row(row)


async def read_schedules(
    conn: asyncpg.Connection, *, owner_id: str, limit: int, after: tuple[datetime, str] | None
) -> list[ScheduleView]:
    """Up to ``limit`` schedules of ``owner_id``, newest first, strictly after the keyset ``after`` (the
    (created_at, schedule_id) of the previous page's last one).
    """
    after_created, after_id = after if after else (None, None)
    rows = await conn.fetch(
        _SELECT_VIEW
        + """ WHERE s.owner_id = $1 AND ($2::timestamptz IS NULL OR (s.created_at, s.schedule_id) < ($2, $3))
        ORDER BY s.created_at DESC, s.schedule_id DESC LIMIT $4""",
        owner_id,
        after_created,
        after_id,
        limit,
    )
    return [ScheduleView.from_row(row) for row in rows]


async def read_runs(
    conn: asyncpg.Connection, *, schedule_id: str, owner_id: str, limit: int, after: tuple[datetime, str] | None
) -> list[OperationView] | None:
    """Up to ``limit`` runs of the schedule, newest due time first, strictly after the keyset ``after`` (the
    (due_at, operation_id) of the previous page's last one); None when the schedule does not exist or is not
    ``owner_id``'s.
    """
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        if not await conn.fetchval(
            "SELECT true FROM export_schedules WHERE schedule_id = $1 AND owner_id = $2", schedule_id, owner_id
        ):
            return None
        after_due, after_id = after if after else (None, None)
        rows = await conn.fetch(
            _READ_RUNS,
            schedule_id,
            owner_id,
            after_due,
            after_id,
            limit,
        )
    return [OperationView.from_row(row) for row in rows]


_READ_RUNS = f"""
    SELECT {select_list(REPRESENTATION_COLUMNS)} FROM {REPRESENTATION_VIEW}
    WHERE schedule_id = $1 AND owner_id = $2
      AND ($3::timestamptz IS NULL OR (due_at, operation_id) < ($3, $4))
    ORDER BY due_at DESC, operation_id DESC LIMIT $5
"""


async def pause(conn: asyncpg.Connection, *, schedule_id: str, owner_id: str) -> ScheduleView | None:
    """ACTIVE -> PAUSED with reason USER, and so does a schedule paused for RUN_NEEDS_REPAIR, so that the repair
    does not resume it against its owner's wish (docs/schedules.md: When a run cannot go on); one paused for
    another reason stays as it is (idempotent). None when the schedule does not exist or is not ``owner_id``'s.
    """
    await conn.execute(
        """
        UPDATE export_schedules SET state = 'PAUSED', paused_reason = 'USER', next_run_at = NULL,
            waiting_reason = NULL, version = version + 1, updated_at = now()
        WHERE schedule_id = $1 AND owner_id = $2
          AND (state = 'ACTIVE' OR paused_reason = 'RUN_NEEDS_REPAIR')
        """,
        schedule_id,
        owner_id,
    )
    return await read_schedule(conn, schedule_id=schedule_id, owner_id=owner_id)


class ResumeOutcome(StrEnum):
    """What a resume decided (docs/schedules.md: The resource)."""

    RESUMED = "resumed"
    NOT_FOUND = "not_found"
    # The owner is no longer a member of the conversation.
    NOT_MEMBER = "not_member"
    # A run is FAILED_REPAIR: the schedule resumes once an operator has repaired it.
    NEEDS_REPAIR = "needs_repair"


@dataclass(frozen=True)
class ResumeResult:
    """A resume's ``outcome`` and the schedule as it is after it (None when NOT_FOUND)."""

    outcome: ResumeOutcome
    schedule: ScheduleView | None


async def resume(conn: asyncpg.Connection, *, schedule_id: str, owner_id: str) -> ResumeResult:
    """PAUSED -> ACTIVE with the next run at the first due time after now (the database's clock); an ACTIVE
    schedule is left as it is (idempotent). Refused while a run is FAILED_REPAIR, or when the owner is no longer
    a member.
    """
    async with conn.transaction():
        row = await conn.fetchrow(
            """
            SELECT now() AS now, s.state, s.every, s.start_at, s.conversation_id,
                   EXISTS (SELECT 1 FROM operations o
                           WHERE o.schedule_id = s.schedule_id AND o.state = 'FAILED_REPAIR') AS needs_repair
            FROM export_schedules s WHERE s.schedule_id = $1 AND s.owner_id = $2 FOR UPDATE
            """,
            schedule_id,
            owner_id,
        )
        if row is None:
            return ResumeResult(ResumeOutcome.NOT_FOUND, None)
        outcome = ResumeOutcome.RESUMED
        if row["state"] == ScheduleState.PAUSED:
            if row["needs_repair"]:
                outcome = ResumeOutcome.NEEDS_REPAIR
            elif not await is_member(conn, conversation_id=row["conversation_id"], user_id=owner_id):
                outcome = ResumeOutcome.NOT_MEMBER
            else:
                await conn.execute(
                    """
                    UPDATE export_schedules SET state = 'ACTIVE', paused_reason = NULL, next_run_at = $2,
                        version = version + 1, updated_at = now()
                    WHERE schedule_id = $1
                    """,
                    schedule_id,
                    Cadence.parse(row["every"]).next_due(row["start_at"], row["now"]),
                )
        schedule = await read_schedule(conn, schedule_id=schedule_id, owner_id=owner_id)
    return ResumeResult(outcome, schedule)


async def delete(conn: asyncpg.Connection, *, schedule_id: str, owner_id: str) -> bool:
    """Delete the schedule and its idempotency records; its runs stay, to their own retention, and one in
    flight finishes. False when it does not exist or is not ``owner_id``'s.
    """
    status = await conn.execute(
        "DELETE FROM export_schedules WHERE schedule_id = $1 AND owner_id = $2", schedule_id, owner_id
    )
    return status == "DELETE 1"


async def pause_where_access_revoked(conn: asyncpg.Connection, *, conversation_id: str) -> int:
    """Pause, with ACCESS_REVOKED and its ``schedule.paused`` callback, every ACTIVE schedule on
    ``conversation_id`` whose owner is no longer a member; the number paused. Called in the transaction that
    removes members, so that a revoked owner's schedule shows PAUSED at once rather than at its next due time
    (docs/schedules.md: When a run cannot go on).
    """
    paused: int = await conn.fetchval(
        """
        SELECT count(*) FILTER (WHERE pause_export_schedule(s.schedule_id, $2))
        FROM export_schedules s
        WHERE s.conversation_id = $1 AND s.state = $3
          AND NOT EXISTS (SELECT 1 FROM conversation_members m
                          WHERE m.conversation_id = s.conversation_id AND m.user_id = s.owner_id)
        """,
        conversation_id,
        PauseReason.ACCESS_REVOKED.value,
        ScheduleState.ACTIVE.value,
    )
    return paused
