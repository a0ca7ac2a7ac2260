"""Creating work (docs/architecture.md: One way to create work): the server-side function ``create_operation_v3``
(migration 0028: migration 0020's first version, storing the media options too, and checking the storage budget
and the submits policy) checks membership, takes the per-user lock, claims the Idempotency-Key when there is
one, applies the quota and the limits and writes the operation and the outbox row that wakes a worker, in one
round trip. A submit calls it asking for the accepted operation as the
status monitor shows it, so that the 202 needs no second round trip (docs/api.md: Submitting an export,
Submit); a schedule's run calls it through ``create_run`` (called by ``shared.repository.schedule_runs.fire``).

With the schedule's creation (``create_export_schedule_v2``, which claims its key with the same function) it
is the only code that writes ``idempotency_keys`` (a user's keys, going with what they created by ``ON DELETE
CASCADE``) and the first row of an operation: one call because a submit's ten round trips bounded how many a
process could answer (docs/benchmark.md: Benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import asyncpg

from shared.broker import EXPORT_ROUTING_KEY
from shared.export.request import ExportRequest
from shared.ids import is_valid_id
from shared.payloads import PAYLOAD_VERSION
from shared.rate_policies import PolicyName
from shared.repository.operation_view import REPRESENTATION_COLUMNS, OperationView, select_list
from shared.states import ACTIVE

_ACTIVE_STATES = sorted(state.value for state in ACTIVE)


class SubmitOutcome(StrEnum):
    """What creating work under a key decided, as the SQL type ``submit_outcome`` (migration 0009) names it."""

    NOT_MEMBER = "not_member"
    # The key's earlier use, for a different request (or for the other kind of thing).
    REUSED = "reused"
    # The key's earlier use, past the replay window.
    EXPIRED = "expired"
    QUOTA = "quota"
    # The key's earlier use for the same request; for a schedule's run: the run of that due time exists.
    REPLAYED = "replayed"
    CREATED = "created"


@dataclass(frozen=True)
class SubmitLimits:
    """A submit's policies: ``submits`` per ``submits_window_seconds`` and a budget of ``content_bytes``."""

    submits: int
    submits_window_seconds: int
    content_bytes: int


@dataclass(frozen=True)
class SubmitResult:
    """What ``submit_export`` did, and the operation it concerns: the new or replayed one, the key's earlier
    one when ``REUSED`` or ``EXPIRED``, None when ``NOT_MEMBER`` or ``QUOTA``. With ``QUOTA``, ``violated`` names
    the limit and ``retry_after_seconds`` when waiting helps (None: it does not, or nobody knows when);
    ``content_bytes_used`` is what the budget found held. When the submits policy was read,
    ``submits_remaining`` and ``submits_reset_seconds`` say what is left of its window and for how long.
    """

    outcome: SubmitOutcome
    operation_id: str | None
    # The operation as the status monitor shows it, read after the submit's writes; when CREATED or REPLAYED.
    accepted: OperationView | None = None
    violated: PolicyName | None = None
    retry_after_seconds: float | None = None
    content_bytes_used: int | None = None
    submits_remaining: int | None = None
    submits_reset_seconds: float | None = None


# The accepted operation's columns named (``REPRESENTATION_COLUMNS``), not ``(accepted).*``.
_SUBMIT = (
    "SELECT outcome::text, operation_id AS submitted_id, violated, submits_remaining, submits_reset_seconds,"
    f" content_bytes_used, retry_after_seconds, {select_list(REPRESENTATION_COLUMNS, '(accepted).')}"
    " FROM create_operation_v3($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10, $11, NULL, NULL, NULL, $12, true,"
    " $13, $14, $15)"
)


async def submit_export(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    owner_id: str,
    conversation_id: str,
    idempotency_key: str,
    fingerprint: str,
    request: ExportRequest,
    replay_window_seconds: int,
    max_active: int,
    limits: SubmitLimits | None,
    traceparent: str | None = None,
) -> SubmitResult:
    """Create ``operation_id`` for ``request`` unless an earlier use of ``idempotency_key`` by ``owner_id``,
    the quota of ``max_active`` active operations, the storage budget and the submits policy of ``limits``
    (checked in that order; only a created export takes from the submits policy; None: an owner no policy
    counts), or the caller's membership decides otherwise; commits with the caller's transaction, or at once
    without one.

    A conversation id that breaks the id syntax (``shared.ids``) cannot be stored, so it is ``NOT_MEMBER``
    without a query, as in ``message_store.is_member``: a U+0000 never reaches Postgres.

    A created operation is stored with ``traceparent`` (the submit's span; docs/monitoring.md: Monitoring,
    Traces). One statement, traced or not.
    """
    if not is_valid_id(conversation_id):
        return SubmitResult(SubmitOutcome.NOT_MEMBER, None)
    row = await conn.fetchrow(
        _SUBMIT,
        operation_id,
        owner_id,
        conversation_id,
        request.as_json(),
        max_active,
        _ACTIVE_STATES,
        EXPORT_ROUTING_KEY,
        PAYLOAD_VERSION,
        idempotency_key,
        fingerprint,
        float(replay_window_seconds),
        traceparent,
        None if limits is None else limits.submits,
        None if limits is None else limits.submits_window_seconds,
        None if limits is None else limits.content_bytes,
    )
    accepted = None if row["operation_id"] is None else OperationView.from_row(row)
    return SubmitResult(
        SubmitOutcome(row["outcome"]),
        row["submitted_id"],
        accepted,
        violated=None if row["violated"] is None else PolicyName(row["violated"]),
        retry_after_seconds=row["retry_after_seconds"],
        content_bytes_used=row["content_bytes_used"],
        submits_remaining=row["submits_remaining"],
        submits_reset_seconds=row["submits_reset_seconds"],
    )


async def create_run(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    owner_id: str,
    conversation_id: str,
    request_json: str,
    max_active: int,
    schedule_id: str,
    due_at: datetime,
    created_at: datetime,
    traceparent: str | None,
) -> SubmitResult:
    """Create ``operation_id``, schedule ``schedule_id``'s run for ``due_at``, as a submit creates an export
    (``request_json``: the request as JSON text), with the run's due time in place of an Idempotency-Key:
    ``NOT_MEMBER``, ``QUOTA``, ``REPLAYED`` (the run for ``due_at`` exists; its id) or ``CREATED``. Runs in the
    caller's transaction; stored as created at ``created_at``, with ``traceparent``. A run is no submit: no rate
    limit counts it, and the storage budget is checked only at submit (docs/api.md: Rate limits).
    """
    row = await conn.fetchrow(
        "SELECT outcome::text, operation_id FROM create_operation_v3($1, $2, $3, $4::jsonb, $5, $6, $7, $8,"
        " NULL, NULL, NULL, $9, $10, $11, $12, false, NULL, NULL, NULL)",
        operation_id,
        owner_id,
        conversation_id,
        request_json,
        max_active,
        _ACTIVE_STATES,
        EXPORT_ROUTING_KEY,
        PAYLOAD_VERSION,
        schedule_id,
        due_at,
        created_at,
        traceparent,
    )
    return SubmitResult(SubmitOutcome(row["outcome"]), row["operation_id"])
