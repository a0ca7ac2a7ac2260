"""Submitting an export (docs/api.md: Submitting an export, Submit): membership, idempotency, quota, and the one
transaction that creates it (``shared.repository.submissions``), and how each of its outcomes is answered.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

from services.api.exporting.outcomes import EXPORT, answer
from services.api.http.metrics import RATE_LIMIT_REFUSALS
from services.api.http.problems import ProblemError, quota_exceeded
from services.api.limiting.policies import Policy, Standing, retry_after_seconds
from shared import tracing
from shared.db import await_replication
from shared.export.fingerprint import fingerprint
from shared.export.request import ExportRequest
from shared.ids import new_operation_id
from shared.rate_policies import PolicyName
from shared.repository.operation_view import OperationView
from shared.repository.submissions import SubmitLimits, SubmitOutcome, SubmitResult, submit_export
from shared.settings import ApiPartSettings

log = logging.getLogger(__name__)

# A spent storage budget's Retry-After when no result will expire to free some: the bytes are running exports'
# (docs/api.md: Rate limits, Refusals).
BUDGET_RETRY_AFTER_SECONDS = 60

# The 202's Retry-After, also on a replay: a new export may end within a second (docs/api.md: Submitting an export,
# Submit).
FIRST_POLL_AFTER_SECONDS = 1


@dataclass(frozen=True)
class AcceptedSubmission:
    """The operation a submission is answered with (202), as the status monitor shows it after the submit's
    writes, whether it was a replay of an earlier one, and where the owner stands against the submit's
    policies (none for an exempt owner; the submits policy only when it was counted).
    """

    operation: OperationView
    replayed: bool
    limits: tuple[Standing, ...] = ()


async def submit(
    conn: asyncpg.Connection,
    settings: ApiPartSettings,
    *,
    owner_id: str,
    conversation_id: str,
    idempotency_key: str,
    request: ExportRequest,
    policies: dict[PolicyName, Policy] | None,
) -> AcceptedSubmission:
    """Create the export, or find the one this key already created; commits at once (one statement). With
    ``policies`` (None: an owner no policy counts), the storage budget and the submits policy hold
    (docs/api.md: Rate limits).

    Raises ``ProblemError`` NOT_FOUND (not a member, or no such conversation), IDEMPOTENCY_KEY_REUSED /
    IDEMPOTENCY_KEY_EXPIRED (409), TOO_MANY_ACTIVE_EXPORTS, CONTENT_BYTES_SPENT or RATE_LIMITED (429); on success
    the operation, its
    idempotency record and its outbox row are committed together. ``conn`` comes from the API's pool, which
    refuses a commit that the synchronous standbys may lack (``shared.db.UnreplicatedCommit``, a 503) when
    it is released (docs/deploy.md: A primary with standbys).
    """
    limits = None
    if policies is not None:
        submits = policies[PolicyName.SUBMITS]
        assert submits.window_seconds is not None
        limits = SubmitLimits(submits.quota, submits.window_seconds, policies[PolicyName.CONTENT_BYTES].quota)
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
        limits=limits,
        traceparent=tracing.current_traceparent(),
    )
    standings = () if policies is None else _standings(result, policies)
    if result.outcome is SubmitOutcome.QUOTA and result.violated is not PolicyName.ACTIVE_EXPORTS:
        raise _over_limit(result, standings)
    replayed = answer(result.outcome, EXPORT, settings)
    if replayed:
        # The operation may be one whose commit held on the primary only (its submit answered 503): the
        # replay answers 202 only once the synchronous standbys hold it.
        await await_replication(conn)
    else:
        # DEBUG: one line per export would be most of the output (docs/operations.md: Logs).
        log.debug("export submitted", extra={"operation_id": result.operation_id, "conversation_id": conversation_id})
    assert result.accepted is not None
    return AcceptedSubmission(result.accepted, replayed=replayed, limits=standings)


def _standings(result: SubmitResult, policies: dict[PolicyName, Policy]) -> tuple[Standing, ...]:
    """Where the owner stands after ``result``: the storage budget when it was read, the submits policy when
    it was counted."""
    standings = []
    if result.content_bytes_used is not None:
        budget = policies[PolicyName.CONTENT_BYTES]
        standings.append(Standing(budget, budget.quota - result.content_bytes_used, result.retry_after_seconds))
    if result.submits_remaining is not None:
        standings.append(Standing(policies[PolicyName.SUBMITS], result.submits_remaining, result.submits_reset_seconds))
    return tuple(standings)


def _over_limit(result: SubmitResult, standings: tuple[Standing, ...]) -> ProblemError:
    """The 429 of a submit the storage budget or the submits policy refused."""
    assert result.violated is not None
    RATE_LIMIT_REFUSALS.labels(result.violated.value).inc()
    spent = next(standing for standing in standings if standing.policy.name is result.violated)
    wait = BUDGET_RETRY_AFTER_SECONDS if result.retry_after_seconds is None else result.retry_after_seconds
    retry_after = retry_after_seconds(wait, margin_seconds=0.0)
    if result.violated is PolicyName.CONTENT_BYTES:
        detail = (
            f"Your results and running exports hold {result.content_bytes_used} of the"
            f" {spent.policy.quota} bytes you may store; cancel an export or wait for a result to expire."
        )
        return quota_exceeded("CONTENT_BYTES_SPENT", detail, spent, retry_after)
    detail = (
        f"You have submitted the {spent.policy.quota} exports allowed per {spent.policy.window_seconds} s;"
        " try again when Retry-After says."
    )
    return quota_exceeded("RATE_LIMITED", detail, spent, retry_after)
