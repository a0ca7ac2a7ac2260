"""How creating work under an Idempotency-Key is answered (docs/api.md: Error codes): one table for an export's
submit and a schedule's creation, whose outcomes (``shared.repository.submissions.SubmitOutcome``) mean the same
and differ only in the words and the quota.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

from services.api.http.metrics import IDEMPOTENCY_CONFLICTS, IDEMPOTENCY_REPLAYS
from services.api.http.problems import ProblemError, not_found, quota_exceeded
from services.api.limiting.policies import Standing, policies
from shared.metrics import AUTHORIZATION_REFUSALS
from shared.rate_policies import PolicyName
from shared.repository.submissions import SubmitOutcome
from shared.settings import ApiPartSettings

QUOTA_RETRY_AFTER_SECONDS = 10


@dataclass(frozen=True)
class Creation:
    """What one kind of created work changes in the answers: the ``chatexport_authorization_refusals_total``
    label of a caller who is not a member, the end of an expired key's detail, and the quota's problem (its
    code, its detail for the settings, a ``Retry-After`` when waiting helps, and the policy a 429 names in its
    rate-limit fields).
    """

    refusal_label: str
    anew: str
    quota_code: str
    quota_detail: Callable[[ApiPartSettings], str]
    quota_retry_after_seconds: int | None = None
    quota_policy: PolicyName | None = None

    @property
    def problems(self) -> tuple[str, ...]:
        """The problem codes ``answer`` raises for this kind, in the order a route declares them."""
        return ("NOT_FOUND", "IDEMPOTENCY_KEY_REUSED", "IDEMPOTENCY_KEY_EXPIRED", self.quota_code)


EXPORT = Creation(
    "submit",
    "start a new export",
    "TOO_MANY_ACTIVE_EXPORTS",
    lambda settings: f"You already have {settings.max_active_exports} exports in progress; retry when one has ended.",
    QUOTA_RETRY_AFTER_SECONDS,
    PolicyName.ACTIVE_EXPORTS,
)
SCHEDULE = Creation(
    "schedule",
    "create a new schedule",
    "TOO_MANY_SCHEDULES",
    lambda settings: (
        f"You already have {settings.max_schedules_per_user} export schedules; delete one to create another."
    ),
)


def answer(outcome: SubmitOutcome, creation: Creation, settings: ApiPartSettings) -> bool:
    """Count ``outcome`` and return whether it was a replay (``REPLAYED``: True, ``CREATED``: False).

    Raises ``ProblemError`` for every other outcome: NOT_FOUND (not a member, or no such conversation),
    IDEMPOTENCY_KEY_REUSED / IDEMPOTENCY_KEY_EXPIRED (409), or ``creation``'s quota problem: the codes of
    ``creation.problems``.
    """
    match outcome:
        case SubmitOutcome.CREATED:
            return False
        case SubmitOutcome.REPLAYED:
            IDEMPOTENCY_REPLAYS.inc()
            return True
        case SubmitOutcome.NOT_MEMBER:
            AUTHORIZATION_REFUSALS.labels(creation.refusal_label).inc()
            raise not_found()
        case SubmitOutcome.REUSED:
            detail = "This Idempotency-Key was already used for a different request; use a new key."
            raise _conflict("IDEMPOTENCY_KEY_REUSED", detail)
        case SubmitOutcome.EXPIRED:
            detail = f"This Idempotency-Key is past its replay window; use a new key to {creation.anew}."
            raise _conflict("IDEMPOTENCY_KEY_EXPIRED", detail)
        case SubmitOutcome.QUOTA if creation.quota_policy is not None:
            standing = Standing(policies(settings)[creation.quota_policy], 0)
            raise quota_exceeded(
                creation.quota_code, creation.quota_detail(settings), standing, creation.quota_retry_after_seconds
            )
        case SubmitOutcome.QUOTA:
            retry_after = creation.quota_retry_after_seconds
            headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
            raise ProblemError(creation.quota_code, creation.quota_detail(settings), headers=headers)
        case _:
            assert_never(outcome)


def _conflict(code: str, detail: str) -> ProblemError:
    IDEMPOTENCY_CONFLICTS.labels(code).inc()
    return ProblemError(code, detail)
