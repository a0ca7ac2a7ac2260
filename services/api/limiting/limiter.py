"""Polls and downloads counted across API processes (docs/api.md: Rate limits, Across processes).

Each process takes a user's allowance from Postgres a batch at a time (``take_allowance``: one atomic
statement on the database's clock) and grants it locally until it is used or its window ends. No window grants
more than its quota, whatever the number of processes, so accepted requests never exceed the policy in a window;
a process holding a batch it has not used may make a user's other processes refuse up to one batch per process
early. A share ends when its window does as this process measured it from before its statement was sent, so it
never outlives the database's window; the ``t`` and ``Retry-After`` it announces add the statement's timeout, so
they are never earlier than the database's. A user whose window is spent is refused locally, without a
statement, until the window ends. Shares of ended windows are dropped every minute.

At most one statement per user and policy is in flight in a process, and the requests that wait for it are
served in their order, each woken only by the take that serves it; it runs on the limiter's own small pool
under ``CHATEXPORT_RATE_LIMIT_TIMEOUT_SECONDS``, so a slow or lost database never takes the API's connections.
A failure is logged, counted and answered as ``CHATEXPORT_RATE_LIMIT_ON_STORE_FAILURE`` says.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass

import asyncpg

from services.api.http.metrics import RATE_LIMIT_REFUSALS, RATE_LIMIT_STORE_FAILURES
from services.api.http.problems import ProblemError, quota_exceeded
from services.api.limiting.policies import Policy, Standing, retry_after_seconds
from shared.db import TRANSIENT_DATABASE_ERRORS, create_pool
from shared.repository.rate_limits import take_allowance
from shared.settings import ApiPartSettings

log = logging.getLogger(__name__)

# A batch is at most this share of a policy's quota, so that a small policy (downloads per hour) is not
# taken whole by one process.
_BATCH_SHARE = 10
# How often the shares whose windows have ended are dropped, in seconds: users who never come back would
# otherwise keep theirs for the process's life.
_SWEEP_SECONDS = 60.0


@dataclass
class _Share:
    """What this process may still grant from a user's window: ``left`` units, of a window with ``remaining``
    more in the database, ending at ``ends_at`` (the loop's clock)."""

    left: int
    remaining: int
    ends_at: float


class RateLimiter:
    """Counts each user's polls and downloads (``admit``). ``start`` opens its pool, ``close`` closes it. Shares
    of ended windows are dropped every ``sweep_seconds``, when a share is taken."""

    def __init__(self, settings: ApiPartSettings, *, sweep_seconds: float = _SWEEP_SECONDS) -> None:
        self._settings = settings
        self._sweep_seconds = sweep_seconds
        self._pool: asyncpg.Pool | None = None
        self._shares: dict[tuple[str, str], _Share] = {}
        # The requests waiting for a user's next batch, first come first served, and the one task taking it.
        self._waiting: dict[tuple[str, str], deque[asyncio.Future[Standing | None]]] = {}
        self._taking: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._next_sweep = 0.0

    async def start(self) -> None:
        """Open the limiter's own pool (no connection yet: the API starts while the database is down)."""
        own = self._settings.model_copy(update={"database_pool_max": self._settings.rate_limit_pool_max})
        self._pool = await create_pool(own, min_size=0)

    async def close(self) -> None:
        """Wait for the statements in flight, then close the pool."""
        if self._taking:
            await asyncio.gather(*self._taking.values(), return_exceptions=True)
        if self._pool is not None:
            await self._pool.close()

    @property
    def held_shares(self) -> int:
        """The users' shares this process holds, by user and policy (at most one each)."""
        return len(self._shares)

    def batch(self, policy: Policy) -> int:
        """The units one statement takes for ``policy``: ``CHATEXPORT_RATE_LIMIT_BATCH``, or a tenth of the
        quota when that is smaller (at least one)."""
        return max(1, min(self._settings.rate_limit_batch, policy.quota // _BATCH_SHARE))

    async def admit(self, user_id: str, policy: Policy) -> Standing | None:
        """Grant one unit of ``policy`` to ``user_id`` and say where the user stands after it; None when the
        store failed and ``CHATEXPORT_RATE_LIMIT_ON_STORE_FAILURE`` is ``open`` (the request goes through
        uncounted).

        Raises ``ProblemError`` 429 RATE_LIMITED (``violated-policies``, ``Retry-After`` at least the time to
        the window's end) when the window is spent, or 503 SERVICE_UNAVAILABLE when the store failed and the
        setting is ``closed``.
        """
        key = (user_id, policy.name.value)
        standing = self._grant(key, policy)
        if standing is not None:
            return standing
        waiter: asyncio.Future[Standing | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(waiter)
        if key not in self._taking:
            self._taking[key] = asyncio.create_task(self._serve(user_id, policy, key))
        # A client that goes away cancels its own wait only: the take goes on for the others.
        standing = await waiter
        if standing is None:
            self._refuse_if_closed()
        return standing

    def _grant(self, key: tuple[str, str], policy: Policy) -> Standing | None:
        """One unit of the share this process holds for ``key``, and where the user stands after it; None when
        it holds none with a unit left and the window is not known to be spent (a take is needed). Raises the
        429 of ``_refusal`` when it is.
        """
        share = self._shares.get(key)
        if share is None:
            return None
        now = asyncio.get_running_loop().time()
        if now >= share.ends_at:
            del self._shares[key]
            return None
        # The share ends early by up to the statement's round trip (``_take_share``); what is announced adds the
        # longest one, so that a client that waits it out finds the database's window ended too.
        renewal = share.ends_at - now + self._settings.rate_limit_timeout_seconds
        if share.left > 0:
            share.left -= 1
            return Standing(policy, share.left + share.remaining, renewal)
        if share.remaining == 0:
            raise self._refusal(Standing(policy, 0, renewal))
        return None

    async def _serve(self, user_id: str, policy: Policy, key: tuple[str, str]) -> None:
        """Take batches for the requests waiting on ``key`` and hand their units out in their order, until none
        waits: each take wakes only the requests it serves, however many wait (docs/api.md: Rate limits,
        Across processes). A failed store answers every waiting request None; an unexpected error is raised
        in each.
        """
        waiting = self._waiting[key]
        try:
            while waiting:
                if await self._take_share(user_id, policy, key) is None:
                    _answer_all(waiting, None)
                    break
                while waiting:
                    waiter = waiting[0]
                    if waiter.done():  # its client went away
                        waiting.popleft()
                        continue
                    try:
                        standing = self._grant(key, policy)
                    except ProblemError as refusal:
                        waiting.popleft().set_exception(refusal)
                        continue
                    if standing is None:
                        break  # this batch is handed out: take another
                    waiting.popleft().set_result(standing)
        except asyncio.CancelledError:
            _answer_all(waiting, asyncio.CancelledError())
            raise
        except Exception as exc:  # raised in the requests that waited, which the error middleware answers
            _answer_all(waiting, exc)
        finally:
            del self._taking[key]
            if not waiting:
                del self._waiting[key]

    async def _take_share(self, user_id: str, policy: Policy, key: tuple[str, str]) -> _Share | None:
        """Take a batch from the user's window into a new share; None when the store failed."""
        assert self._pool is not None and policy.window_seconds is not None
        loop = asyncio.get_running_loop()
        sent = loop.time()
        try:
            async with asyncio.timeout(self._settings.rate_limit_timeout_seconds):
                async with self._pool.acquire() as conn:
                    allowance = await take_allowance(
                        conn,
                        user_id=user_id,
                        policy=policy.name.value,
                        quota=policy.quota,
                        window_seconds=policy.window_seconds,
                        wanted=self.batch(policy),
                    )
        except (*TRANSIENT_DATABASE_ERRORS, asyncpg.PostgresError) as exc:
            RATE_LIMIT_STORE_FAILURES.labels(policy.name.value).inc()
            log.warning(
                "rate limit store failed",
                extra={"policy": policy.name.value, "error": type(exc).__name__, "mode": self._mode},
            )
            return None
        # Measured from before the statement was sent: the share never outlives the database's window.
        share = _Share(allowance.granted, allowance.remaining, sent + allowance.reset_seconds)
        now = loop.time()
        if now >= self._next_sweep:
            self._shares = {held: kept for held, kept in self._shares.items() if kept.ends_at > now}
            self._next_sweep = now + self._sweep_seconds
        self._shares[key] = share
        return share

    @property
    def _mode(self) -> str:
        return self._settings.rate_limit_on_store_failure

    def _refuse_if_closed(self) -> None:
        if self._mode == "closed":
            raise ProblemError(
                "SERVICE_UNAVAILABLE", "The service is busy; try again shortly.", headers={"Retry-After": "5"}
            )

    def _refusal(self, standing: Standing) -> ProblemError:
        policy = standing.policy
        RATE_LIMIT_REFUSALS.labels(policy.name.value).inc()
        reset = standing.reset_seconds or 0.0
        return quota_exceeded(
            "RATE_LIMITED",
            f"You have used the {policy.quota} {policy.name.value} allowed per {policy.window_seconds} s;"
            " try again when Retry-After says.",
            standing,
            retry_after_seconds(reset, margin_seconds=0.0),
        )


def _answer_all(waiting: deque[asyncio.Future[Standing | None]], outcome: Standing | BaseException | None) -> None:
    """End every request still waiting with ``outcome``: a result, or an exception raised in each."""
    while waiting:
        waiter = waiting.popleft()
        if waiter.done():
            continue
        if isinstance(outcome, asyncio.CancelledError):
            waiter.cancel()
        elif isinstance(outcome, BaseException):
            waiter.set_exception(outcome)
        else:
            waiter.set_result(outcome)
