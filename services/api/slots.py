"""Bounds on long-held connections (downloads today): so many per process, and fewer per user, so that one
user can never hold every slot (README: API reference, Download slots).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

from services.api.problems import Problem


class ConnectionSlots:
    """At most ``total`` connections at once in this process, and at most ``per_user`` of them for one user.

    ``what`` names the connections in the refusals' details ("downloads"); ``code`` is the problem code a
    user over their own cap gets. Single-threaded asyncio: the counts need no lock.
    """

    def __init__(self, *, total: int, per_user: int, what: str, code: str) -> None:
        self._total = total
        self._per_user = per_user
        self._what = what
        self._code = code
        self._held: Counter[str] = Counter()

    @property
    def in_use(self) -> int:
        """Slots held right now, by everyone."""
        return self._held.total()

    def check(self, user_id: str) -> None:
        """Raise the refusal ``take`` would raise for ``user_id`` now, without taking a slot: ``Problem`` 429
        with ``code`` when the user holds ``per_user`` slots, else 503 SERVICE_UNAVAILABLE when all are held.
        """
        if self._held[user_id] >= self._per_user:
            raise Problem(
                self._code,
                f"You already have {self._per_user} {self._what} open; finish one first.",
                headers={"Retry-After": "5"},
            )
        if self.in_use >= self._total:
            raise Problem(
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
