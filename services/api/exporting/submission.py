"""Submitting an export (docs/api.md: Submitting an export, Submit): membership, idempotency, quota, and the one
transaction that creates it (``shared.repository.submissions``), and how each of its outcomes is answered.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

from services.api.exporting.outcomes import EXPORT, answer
from shared import tracing
from shared.db import await_replication
from shared.export.fingerprint import fingerprint
from shared.export.request import ExportRequest
from shared.ids import new_operation_id
from shared.repository.operation_view import OperationView
from shared.repository.submissions import submit_export
from shared.settings import ApiPartSettings

log = logging.getLogger(__name__)

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
    settings: ApiPartSettings,
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
    replayed = answer(result.outcome, EXPORT, settings)
    if replayed:
        # The operation may be one whose commit held on the primary only (its submit answered 503): the
        # replay answers 202 only once the synchronous standbys hold it.
        await await_replication(conn)
    else:
        log.info("export submitted", extra={"operation_id": result.operation_id, "conversation_id": conversation_id})
    assert result.accepted is not None
    return AcceptedSubmission(result.accepted, replayed=replayed)
