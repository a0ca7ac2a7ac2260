"""The submit's transaction (README: API reference, Submit): the server-side function ``submit_export``
(migration 0008) checks membership, takes the per-user lock, looks the Idempotency-Key up, applies the quota
and writes the operation, its idempotency record and its outbox row, in one round trip.

It is the only code that writes ``idempotency_keys`` (a user's keys, going with their operation by ``ON
DELETE CASCADE``), and writes the first row of an operation and its first outbox row, which ``operations``
and ``outbox`` go on to change: one call because a submit's ten round trips bounded how many a process
could answer (README: Benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from shared.broker import EXPORT_ROUTING_KEY
from shared.export_request import ExportRequest
from shared.ids import is_valid_id
from shared.repository.rows import Row
from shared.states import ACTIVE

_ACTIVE_STATES = sorted(state.value for state in ACTIVE)


@dataclass(frozen=True)
class SubmitOutcome(Row):
    """What ``submit_export`` did: ``outcome`` is ``created`` or ``replayed`` (``operation_id`` is the
    operation), ``reused`` or ``expired`` (the key's earlier operation), ``quota`` or ``not_member``.
    """

    outcome: str
    operation_id: str | None


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
) -> SubmitOutcome:
    """Create ``operation_id`` for ``request`` unless an earlier use of ``idempotency_key`` by ``owner_id``,
    the quota of ``max_active`` active operations, or the caller's membership decides otherwise; commits
    with the caller's transaction, or at once without one.

    A conversation id that breaks the id syntax (``shared.ids``) cannot be stored, so it is ``not_member``
    without a query, as in ``conversations.is_member``: a U+0000 never reaches Postgres.
    """
    if not is_valid_id(conversation_id):
        return SubmitOutcome("not_member", None)
    row = await conn.fetchrow(
        "SELECT * FROM submit_export($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)",
        operation_id,
        owner_id,
        conversation_id,
        idempotency_key,
        fingerprint,
        float(replay_window_seconds),
        max_active,
        _ACTIVE_STATES,
        EXPORT_ROUTING_KEY,
        request.format,
        request.before_seq,
        request.after_seq,
        request.notify_url,
        request.since,
        request.until,
        None if request.senders is None else list(request.senders),
        request.compression,
        request.max_part_bytes,
    )
    return SubmitOutcome.from_row(row)
