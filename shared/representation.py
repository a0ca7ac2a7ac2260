"""The operation representation (docs/api.md: Operations, Operation), built from a repository row, and its
admin view.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

import asyncpg

from shared.export.phases import Phase
from shared.export.request import SCHEDULE_REFUSED_OPTIONS, SUBMIT_ONLY_OPTIONS
from shared.repository.chunks import Chunk
from shared.repository.operation_view import OperationView, Stamped
from shared.repository.schedules import ScheduleView
from shared.routes import path
from shared.states import TERMINAL, State
from shared.timefmt import format_timestamp

EVENT_STREAM = "text/event-stream"


def next_poll_after_seconds(age_seconds: float) -> int:
    """How long a client should wait before polling again: grows with the operation's age, 1 to 30 s."""
    return max(1, min(30, math.ceil(age_seconds / 10)))


def is_terminal(row: Stamped) -> bool:
    """True when the operation will not change without an operator: no Retry-After (docs/api.md: Operations,
    Operation).
    """
    # The text compares equal to its State (a StrEnum): no conversion on the poll path, which calls this twice.
    return row.state in TERMINAL


def represent(row: OperationView) -> dict[str, Any]:
    """The JSON object of one operation (docs/api.md: Operations, Operation)."""
    operation_id = row.operation_id
    terminal = is_terminal(row)
    snapshot_max_seq = row.snapshot_max_seq
    body: dict[str, Any] = {
        "operation_id": operation_id,
        "kind": row.kind,
        "state": row.state,
        "conversation_id": row.conversation_id,
        "request": row.request.options(),
        "estimate": {"messages_at_most": messages_at_most(row), "bytes": row.estimate_bytes},
        "created_at": format_timestamp(row.created_at),
        "updated_at": format_timestamp(row.updated_at),
        "attempt": row.attempt,
        "progress": {
            "phase": row.progress_phase or Phase.WAITING,
            "messages_written": row.messages_written,
            "bytes_written": row.bytes_written,
        },
        "snapshot": None if snapshot_max_seq is None else {"max_seq": snapshot_max_seq},
        "retry_at": format_timestamp(row.retry_at),
        "error": _error(row),
        "result": _result(row),
        "links": _links(operation_id, row.state, terminal, split=row.result_parts is not None),
        "done": terminal,
        "schedule_id": row.schedule_id,
        "due_at": format_timestamp(row.due_at),
    }
    if not terminal:
        body["next_poll_after_seconds"] = next_poll_after_seconds(row.age_seconds)
    return body


def represent_schedule(schedule: ScheduleView) -> dict[str, Any]:
    """The JSON object of one export schedule (docs/schedules.md: The resource): its runs' options as an
    operation shows them but the two a schedule refuses and those of a submit alone, never its callback's URL.
    """
    options = schedule.request.options()
    for refused in (*SCHEDULE_REFUSED_OPTIONS, *SUBMIT_ONLY_OPTIONS):
        del options[refused]
    last_run = None
    if schedule.last_operation_id is not None and schedule.last_run_state is not None:
        last_run = {
            "operation_id": schedule.last_operation_id,
            "due_at": format_timestamp(schedule.last_run_due_at),
            "state": schedule.last_run_state,
        }
    schedule_id = schedule.schedule_id
    return {
        "schedule_id": schedule_id,
        "conversation_id": schedule.conversation_id,
        "every": schedule.every.text,
        "start_at": format_timestamp(schedule.start_at),
        "mode": schedule.mode,
        "options": options,
        "state": schedule.state.value,
        "paused_reason": None if schedule.paused_reason is None else schedule.paused_reason.value,
        "waiting_reason": None if schedule.waiting_reason is None else schedule.waiting_reason.value,
        "next_run_at": format_timestamp(schedule.next_run_at),
        "watermark": schedule.watermark,
        "last_run": last_run,
        "created_at": format_timestamp(schedule.created_at),
        "updated_at": format_timestamp(schedule.updated_at),
        "links": {
            "self": path("getExportSchedule", schedule_id=schedule_id),
            "runs": path("listExportScheduleRuns", schedule_id=schedule_id),
        },
    }


def _error(row: OperationView) -> dict[str, str] | None:
    if row.error_code is None:
        return None
    return {"code": row.error_code, "message": row.error_message or ""}


def messages_at_most(row: OperationView) -> int | None:
    """An upper bound of the messages the file holds (docs/api.md: Operations, Operation): known from the submit
    with ``before_seq``, from the first claim's watermark without it, None before.
    """
    request = row.request
    if request.before_seq is not None:
        return request.before_seq - 1 - request.after_seq
    if row.snapshot_max_seq is None:
        return None
    return max(0, row.snapshot_max_seq - request.after_seq)


def _result(row: OperationView) -> dict[str, Any] | None:
    if row.state != State.SUCCEEDED:
        return None
    operation_id = row.operation_id
    figures = {
        "message_count": row.result_message_count,
        "content_type": row.request.file_kind.content_type,
        # The watermark: every message after it is new to this export (docs/api.md: Submitting an export, Export
        # options).
        "next_after_seq": row.snapshot_max_seq,
    }
    expires_at = format_timestamp(row.result_expires_at)
    parts = result_parts(row)
    if parts:
        return {"expires_at": expires_at, **figures, "parts": [_part(operation_id, part) for part in parts]}
    return {
        "url": path("downloadResult", operation_id=operation_id),
        "expires_at": expires_at,
        "size_bytes": row.result_size_bytes,
        "sha256": row.result_sha256,
        **figures,
    }


def result_parts(row: OperationView) -> list[dict[str, Any]]:
    """The published parts of a split result (``repository.artifacts.StoredPart`` fields), in order; [] for one file."""
    parts: list[dict[str, Any]] = [] if row.result_parts is None else json.loads(row.result_parts)
    return parts


def _part(operation_id: str, part: dict[str, Any]) -> dict[str, Any]:
    return {
        "number": part["number"],
        "url": path("downloadResultPart", operation_id=operation_id, number=part["number"]),
        **{name: part[name] for name in ("size_bytes", "sha256", "message_count", "first_seq", "last_seq")},
    }


def _links(operation_id: str, state: str, terminal: bool, *, split: bool) -> dict[str, str]:
    links = {"self": path("getOperation", operation_id=operation_id)}
    if not terminal:
        links["cancel"] = path("cancelOperation", operation_id=operation_id)
    if state == State.SUCCEEDED and not split:
        links["result"] = path("downloadResult", operation_id=operation_id)
    return links


def represent_for_admin_list(row: OperationView) -> dict[str, Any]:
    """One operation as the admin list shows it: the owner's representation (``represent``) plus its owner,
    generation, lease holder and expiry, end time and result expiry (docs/api.md: Administration, Admin view of
    an operation). ``row`` is one of ``repository.status_monitor.read_operation``.
    """
    return {
        **represent(row),
        "owner_id": row.owner_id,
        "generation": row.generation,
        "lease_owner": row.lease_owner,
        "lease_expires_at": format_timestamp(row.lease_expires_at),
        "finished_at": format_timestamp(row.finished_at),
        "result_expires_at": format_timestamp(row.result_expires_at),
    }


def represent_for_admin(
    row: OperationView,
    *,
    attempts: list[asyncpg.Record],
    artifacts: list[asyncpg.Record],
    access_events: list[asyncpg.Record],
    access_events_total: int,
    webhook_deliveries: list[asyncpg.Record],
    chunks: list[Chunk],
) -> dict[str, Any]:
    """The admin view of one operation: ``represent_for_admin_list`` plus its attempts, artifacts, access
    events (``access_events_total`` counts them all when the list holds only the newest), completion
    callbacks with every attempt to send them, and a chunked export's chunks. Artifacts and chunks show
    their object key, never a download URL; callbacks never show their URL, whose query may hold a secret.
    """
    return {
        **represent_for_admin_list(row),
        "attempts": [_with_timestamps(attempt, "claimed_at", "ended_at") for attempt in attempts],
        "artifacts": [_with_timestamps(artifact, "created_at", "updated_at") for artifact in artifacts],
        "access_events": [_with_timestamps(event, "occurred_at") for event in access_events],
        "access_events_total": access_events_total,
        "webhook_deliveries": [_delivery(delivery) for delivery in webhook_deliveries],
        "chunks": [_chunk(chunk) for chunk in chunks],
    }


def _chunk(chunk: Chunk) -> dict[str, Any]:
    fields = {name: getattr(chunk, name) for name in Chunk.__dataclass_fields__}
    return {
        **fields,
        "worker": fields.pop("lease_owner"),
        "lease_expires_at": format_timestamp(chunk.lease_expires_at),
        "updated_at": format_timestamp(chunk.updated_at),
    }


def _delivery(row: asyncpg.Record) -> dict[str, Any]:
    rendered = _with_timestamps(row, "created_at", "delivered_at", "gave_up_at")
    rendered["attempts"] = [
        {**attempt, "attempted_at": format_timestamp(datetime.fromisoformat(attempt["attempted_at"]))}
        for attempt in json.loads(row["attempts"])
    ]
    return rendered


def _with_timestamps(row: asyncpg.Record, *names: str) -> dict[str, Any]:
    """``row`` as a dict with its ``names`` columns rendered as API timestamps (``shared.timefmt``)."""
    rendered = dict(row.items())
    for name in names:
        rendered[name] = format_timestamp(row[name])
    return rendered
