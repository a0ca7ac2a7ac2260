"""Submitting an export (docs/api.md: Submitting an export, Submit): membership, idempotency, quota, and the one
transaction that creates it (``shared.repository.submissions``), and how each of its outcomes is answered.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import assert_never

import asyncpg

from services.api.http.metrics import IDEMPOTENCY_CONFLICTS, IDEMPOTENCY_REPLAYS
from services.api.http.problems import ProblemError, not_found
from shared import tracing
from shared.db import await_replication
from shared.export.fingerprint import fingerprint
from shared.export.request import ExportRequest
from shared.ids import new_operation_id
from shared.metrics import AUTHORIZATION_REFUSALS
from shared.repository.operation_view import OperationView
from shared.repository.submissions import SubmitOutcome, SubmitResult, submit_export
from shared.settings import Settings

log = logging.getLogger(__name__)

QUOTA_RETRY_AFTER_SECONDS = 10
# The 202's Retry-After, also on a replay: a new export may end within a second (docs/api.md: Submitting an export,
# Submit).
FIRST_POLL_AFTER_SECONDS = 1


@dataclass(frozen=True)
class AcceptedSubmission:
    """The operation a submission is answered with (202), as the status monitor shows it after the submit's
    writes, and whether it was a replay of an earlier one.
    """

    operation: OperationView
    replayed: bool


async def submit(
    conn: asyncpg.Connection,
    settings: Settings,
    *,
    owner_id: str,
    conversation_id: str,
    idempotency_key: str,
    request: ExportRequest,
) -> AcceptedSubmission:
    """Create the export, or find the one this key already created; commits at once (one statement).

    Raises ``ProblemError`` NOT_FOUND (not a member, or no such conversation), IDEMPOTENCY_KEY_REUSED /
    IDEMPOTENCY_KEY_EXPIRED (409) or TOO_MANY_ACTIVE_EXPORTS (429); on success the operation, its
    idempotency record and its outbox row are committed together. ``conn`` comes from the API's pool, which
    refuses a commit that the synchronous standbys may lack (``shared.db.UnreplicatedCommit``, a 503) when
    it is released (docs/deploy.md: A primary with standbys).
    """
    operation_id = new_operation_id()
    tracing.set_attributes(**{tracing.OPERATION_ID: operation_id})
    result = await submit_export(
        conn,
        operation_id=operation_id,
        owner_id=owner_id,
        conversation_id=conversation_id,
        idempotency_key=idempotency_key,
        fingerprint=fingerprint(user_id=owner_id, conversation_id=conversation_id, request=request),
        request=request,
        replay_window_seconds=settings.idempotency_replay_window_seconds,
        max_active=settings.max_active_exports,
        traceparent=tracing.current_traceparent(),
    )
    if result.outcome is SubmitOutcome.CREATED:
        log.info("export submitted", extra={"operation_id": result.operation_id, "conversation_id": conversation_id})
    elif result.outcome is SubmitOutcome.REPLAYED:
        # The operation may be one whose commit held on the primary only (its submit answered 503): the
        # replay answers 202 only once the synchronous standbys hold it.
        await await_replication(conn)
    return _answer(result, settings)


def _answer(result: SubmitResult, settings: Settings) -> AcceptedSubmission:
    """Every outcome's answer and count, in one place (docs/api.md: Submitting an export, Submit; docs/api.md: Error
    codes)."""
    match result.outcome:
        case SubmitOutcome.CREATED | SubmitOutcome.REPLAYED:
            assert result.accepted is not None
            replayed = result.outcome is SubmitOutcome.REPLAYED
            if replayed:
                IDEMPOTENCY_REPLAYS.inc()
            return AcceptedSubmission(result.accepted, replayed=replayed)
        case SubmitOutcome.NOT_MEMBER:
            AUTHORIZATION_REFUSALS.labels("submit").inc()
            raise not_found()
        case SubmitOutcome.REUSED | SubmitOutcome.EXPIRED:
            raise key_conflict(result.outcome, anew="start a new export")
        case SubmitOutcome.QUOTA:
            raise ProblemError(
                "TOO_MANY_ACTIVE_EXPORTS",
                f"You already have {settings.max_active_exports} exports in progress; retry when one has ended.",
                headers={"Retry-After": str(QUOTA_RETRY_AFTER_SECONDS)},
            )
        case _:
            assert_never(result.outcome)


def key_conflict(outcome: SubmitOutcome, *, anew: str) -> ProblemError:
    """The 409 of a key whose earlier use decides (docs/api.md: Error codes), counted: IDEMPOTENCY_KEY_REUSED for
    ``REUSED``, IDEMPOTENCY_KEY_EXPIRED for ``EXPIRED``, whose detail tells to use a new key to ``anew``.
    """
    if outcome is SubmitOutcome.REUSED:
        code, detail = (
            "IDEMPOTENCY_KEY_REUSED",
            "This Idempotency-Key was already used for a different request; use a new key.",
        )
    else:
        code, detail = (
            "IDEMPOTENCY_KEY_EXPIRED",
            f"This Idempotency-Key is past its replay window; use a new key to {anew}.",
        )
    IDEMPOTENCY_CONFLICTS.labels(code).inc()
    return ProblemError(code, detail)
