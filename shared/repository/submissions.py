"""The submit's transaction (docs/api.md: Submitting an export, Submit): the server-side function ``submit_export_v2``
(migration 0009) checks membership, takes the per-user lock, looks the Idempotency-Key up, applies the quota
and writes the operation, its idempotency record and its outbox row, in one round trip; called through
``submit_export_answered`` (migration 0018), which adds the accepted operation as the status monitor shows
it, so that the 202 needs no second round trip.

It is the only code that writes ``idempotency_keys`` (a user's keys, going with their operation by ``ON
DELETE CASCADE``), and writes the first row of an operation and its first outbox row, which ``operations``
and ``outbox`` go on to change: one call because a submit's ten round trips bounded how many a process
could answer (docs/benchmark.md: Benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import asyncpg

from shared.broker import EXPORT_ROUTING_KEY
from shared.export.request import ExportRequest
from shared.ids import is_valid_id
from shared.repository.operation_view import OperationView
from shared.states import ACTIVE

_ACTIVE_STATES = sorted(state.value for state in ACTIVE)


class SubmitOutcome(StrEnum):
    """What the submit decided, as the SQL type ``submit_outcome`` (migration 0009) names it."""

    NOT_MEMBER = "not_member"
    # The key's earlier operation, for a different request.
    REUSED = "reused"
    # The key's earlier operation, past the replay window.
    EXPIRED = "expired"
    QUOTA = "quota"
    REPLAYED = "replayed"
    CREATED = "created"


@dataclass(frozen=True)
class SubmitResult:
    """What ``submit_export`` did, and the operation it concerns: the new or replayed one, the key's earlier
    one when ``REUSED`` or ``EXPIRED``, None when ``NOT_MEMBER`` or ``QUOTA``.
    """

    outcome: SubmitOutcome
    operation_id: str | None
    # The operation as the status monitor shows it, read after the submit's writes; when CREATED or REPLAYED.
    accepted: OperationView | None = None


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
    traceparent: str | None = None,
) -> SubmitResult:
    """Create ``operation_id`` for ``request`` unless an earlier use of ``idempotency_key`` by ``owner_id``,
    the quota of ``max_active`` active operations, or the caller's membership decides otherwise; commits
    with the caller's transaction, or at once without one.

    A conversation id that breaks the id syntax (``shared.ids``) cannot be stored, so it is ``NOT_MEMBER``
    without a query, as in ``message_store.is_member``: a U+0000 never reaches Postgres.

    A created operation is stored with ``traceparent`` (the submit's span; docs/monitoring.md: Monitoring,
    Traces). One statement, traced or not.
    """
    if not is_valid_id(conversation_id):
        return SubmitResult(SubmitOutcome.NOT_MEMBER, None)
    row = await conn.fetchrow(
        "SELECT outcome::text, operation_id AS submitted_id, (accepted).*"
        " FROM submit_export_answered($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11)",
        operation_id,
        owner_id,
        conversation_id,
        idempotency_key,
        fingerprint,
        float(replay_window_seconds),
        max_active,
        _ACTIVE_STATES,
        EXPORT_ROUTING_KEY,
        request.as_json(),
        traceparent,
    )
    accepted = None if row["operation_id"] is None else OperationView.from_row(row)
    return SubmitResult(SubmitOutcome(row["outcome"]), row["submitted_id"], accepted)
