"""Bounds on long-held connections (downloads, long polls and event streams): so many per process, and fewer
per user, so that one user can never hold every slot (docs/api.md: Downloads, Download slots; Waiting for a
change). Every refusal is counted (docs/monitoring.md: Monitoring).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

from services.api.http.metrics import CAP_REFUSALS
from services.api.http.problems import ProblemError, quota_exceeded
from services.api.limiting.policies import Policy, Standing

# When a slot of one's own frees up is unknown: a short wait.
_CAP_RETRY_AFTER_SECONDS = 5


class ConnectionSlots:
    """At most ``total`` connections at once in this process, and at most ``per_user`` of them for one user.

    ``name`` is the prefix of the two caps' settings, ``<name>_concurrency`` (``total``) and
    ``<name>_per_user_concurrency`` (``per_user``): ``CAP_REFUSALS`` counts each refusal under the name of
    the setting that caused it, so that an operator knows which one to raise. ``what`` names the connections
    in the refusals' details ("downloads"); ``code`` is the problem code a user over their own cap gets, which
    names ``policy`` (the per-user cap as a policy) in its rate-limit fields. Single-threaded asyncio: the
    counts need no lock.
    """

    def __init__(self, *, total: int, policy: Policy, name: str, what: str, code: str) -> None:
        self._total = total
        self._policy = policy
        self._per_user = policy.quota
        self._what = what
        self._code = code
        self._held: Counter[str] = Counter()
        # Created now, so that both series exist at 0 before the first refusal.
        self._refused_total = CAP_REFUSALS.labels(f"{name}_concurrency")
        self._refused_per_user = CAP_REFUSALS.labels(f"{name}_per_user_concurrency")

    @property
    def in_use(self) -> int:
        """Slots held right now, by everyone."""
        return self._held.total()

    def held_by(self, user_id: str) -> int:
        """Slots ``user_id`` holds right now."""
        return self._held[user_id]

    def check(self, user_id: str) -> None:
        """Raise the refusal ``take`` would raise for ``user_id`` now, without taking a slot: ``ProblemError`` 429
        with ``code`` when the user holds ``per_user`` slots, else 503 SERVICE_UNAVAILABLE when all are held.
        """
        if self._held[user_id] >= self._per_user:
            self._refused_per_user.inc()
            raise quota_exceeded(
                self._code,
                f"You already have {self._per_user} {self._what} open; finish one first.",
                Standing(self._policy, 0),
                _CAP_RETRY_AFTER_SECONDS,
            )
        if self.in_use >= self._total:
            self._refused_total.inc()
            raise ProblemError(
                "SERVICE_UNAVAILABLE", f"Too many {self._what} right now; try again soon.", headers={"Retry-After": "5"}
            )

    @contextlib.contextmanager
    def take(self, user_id: str) -> Iterator[None]:
        """Hold one slot for ``user_id`` for the block; raises what ``check`` raises when none is free."""
        self.check(user_id)
        self._held[user_id] += 1
        try:
            yield
        finally:
            self._held[user_id] -= 1
            if not self._held[user_id]:
                del self._held[user_id]
