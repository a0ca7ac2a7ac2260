"""Submitting an export (README: API reference, Submit): membership, idempotency, quota, and the one
transaction that creates it (``shared.repository.submissions``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

from services.api.metrics import IDEMPOTENCY_CONFLICTS
from services.api.problems import Problem, not_found
from shared.export_request import ExportRequest
from shared.fingerprint import fingerprint
from shared.ids import new_operation_id
from shared.metrics import AUTHORIZATION_REFUSALS
from shared.repository.submissions import submit_export
from shared.settings import Settings

log = logging.getLogger(__name__)

QUOTA_RETRY_AFTER_SECONDS = 10

_CONFLICTS = {
    "reused": (
        "IDEMPOTENCY_KEY_REUSED",
        "This Idempotency-Key was already used for a different request; use a new key.",
    ),
    "expired": (
        "IDEMPOTENCY_KEY_EXPIRED",
        "This Idempotency-Key is past its replay window; use a new key to start a new export.",
    ),
}


@dataclass(frozen=True)
class Submitted:
    """The operation a submission answers with, and whether it was a replay of an earlier one."""

    operation_id: str
    replayed: bool


async def submit(
    conn: asyncpg.Connection,
    settings: Settings,
    *,
    owner_id: str,
    conversation_id: str,
    idempotency_key: str,
    request: ExportRequest,
) -> Submitted:
    """Create the export, or find the one this key already created; commits at once (one statement).

    Raises ``Problem`` NOT_FOUND (not a member, or no such conversation), IDEMPOTENCY_KEY_REUSED /
    IDEMPOTENCY_KEY_EXPIRED (409) or TOO_MANY_ACTIVE_EXPORTS (429); on success the operation, its
    idempotency record and its outbox row are committed together.
    """
    outcome = await submit_export(
        conn,
        operation_id=new_operation_id(),
        owner_id=owner_id,
        conversation_id=conversation_id,
        idempotency_key=idempotency_key,
        fingerprint=fingerprint(user_id=owner_id, conversation_id=conversation_id, request=request),
        request=request,
        replay_window_seconds=settings.idempotency_replay_window_seconds,
        max_active=settings.max_active_exports,
    )
    if outcome.outcome == "not_member":
        AUTHORIZATION_REFUSALS.labels("submit").inc()
        raise not_found()
    if outcome.outcome in _CONFLICTS:
        IDEMPOTENCY_CONFLICTS.labels(_CONFLICTS[outcome.outcome][0]).inc()
        raise Problem(*_CONFLICTS[outcome.outcome])
    if outcome.outcome == "quota":
        raise Problem(
            "TOO_MANY_ACTIVE_EXPORTS",
            f"You already have {settings.max_active_exports} exports in progress; retry when one has ended.",
            headers={"Retry-After": str(QUOTA_RETRY_AFTER_SECONDS)},
        )
    assert outcome.operation_id is not None
    if outcome.outcome == "created":
        log.info("export submitted", extra={"operation_id": outcome.operation_id, "conversation_id": conversation_id})
    return Submitted(operation_id=outcome.operation_id, replayed=outcome.outcome == "replayed")
