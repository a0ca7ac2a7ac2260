"""Where an export's message reads go: a hot standby that has caught up with the claim, else the primary
(docs/deploy.md: Export reads on a hot standby).

An attempt or a chunk takes the primary's WAL position once its claim has committed. Each range it reads
goes to the standby only when that standby has replayed past that position, so the standby shows every
message the primary had when the work was claimed, and the claim's own row must be there under its
generation (a standby forked from another history can be past the position without it); a standby that
lags longer than
``database_read_wait_seconds``, is unreachable, or cancels a read for a recovery conflict sends the rest of
that attempt's reads to the primary. Membership checks and every write stay on the primary: only
``RangeReader`` reads through this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from services.worker import metrics

log = logging.getLogger(__name__)

T = TypeVar("T")

ClaimVisible = Callable[[asyncpg.Connection], Awaitable[bool]]
"""Whether a connection's server shows the claim's own row under the claimed generation."""

# How often a lagging standby's replay position is asked again while an attempt waits for it (seconds).
REPLAY_POLL_SECONDS = 0.02

# A standby cancels a statement that conflicts with the replay of a change once it has waited
# ``max_standby_streaming_delay``: 40001 for snapshot, lock and tablespace conflicts, 40P01 for a buffer-pin
# deadlock, 57P04 when the database was dropped (PostgreSQL's ``ProcessInterrupts``).
RECOVERY_CONFLICTS: tuple[type[BaseException], ...] = (
    asyncpg.SerializationError,
    asyncpg.DeadlockDetectedError,
    asyncpg.DatabaseDroppedError,
)

# NULL when the server is not in recovery, else whether it has replayed the primary's WAL up to $1. A server
# that is not a standby (one promoted since, an old primary left running) writes WAL of a history of its own,
# so its positions say nothing about the primary's.
_CAUGHT_UP_SQL = "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() >= $1::pg_lsn END"


class ReadSource:
    """The worker's two ways to read messages: the ``primary`` pool, and the ``standby`` pool of
    ``database_read_url`` (None: every read goes to the primary). ``wait_seconds`` bounds how long one
    attempt waits for the standby to catch up. ``claim`` (set by ``claimed``) is asked once per attempt on
    the standby before its first read there.
    """

    def __init__(
        self,
        *,
        primary: asyncpg.Pool,
        standby: asyncpg.Pool | None = None,
        wait_seconds: float = 0.0,
        claim: ClaimVisible | None = None,
    ):
        self._primary = primary
        self._standby = standby
        self._wait_seconds = wait_seconds
        self._claim = claim

    def claimed(self, claim: ClaimVisible) -> ReadSource:
        """This source for one claim's reads: the standby serves them only when ``claim(conn)`` is true there
        (the claim's row under its generation), else they go to the primary (``claim_not_visible``).
        """
        return ReadSource(primary=self._primary, standby=self._standby, wait_seconds=self._wait_seconds, claim=claim)

    async def begin(self) -> ExportReads:
        """The reads of one attempt or chunk whose claim has committed: with a standby, the primary's WAL
        position now (``pg_current_wal_lsn()``), which every later read must see. Raises what the driver raises
        when the primary cannot answer.
        """
        if self._standby is None:
            return ExportReads(self._primary, None, position=None, deadline=0.0)
        async with self._primary.acquire() as conn:
            position: int = await conn.fetchval("SELECT pg_current_wal_lsn()")
        return ExportReads(
            self._primary,
            self._standby,
            position=position,
            deadline=time.monotonic() + self._wait_seconds,
            claim=self._claim,
        )


class ExportReads:
    """The reads of one attempt or chunk: ``run(read)`` gives ``read`` a connection on the standby while it
    has replayed past ``position`` and, the first time, shows the claim (``claim``), else on the primary;
    ``finish()`` counts where they went.
    """

    def __init__(
        self,
        primary: asyncpg.Pool,
        standby: asyncpg.Pool | None,
        *,
        position: int | None,
        deadline: float,
        claim: ClaimVisible | None = None,
    ):
        self._primary = primary
        self._standby = standby
        self._position = position
        self._deadline = deadline  # time.monotonic() after which a lagging standby is given up
        self._claim = claim  # None once the standby showed it: asked once per attempt
        self._servers: set[str] = set()

    async def run(self, read: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """``await read(conn)`` on the standby when it shows everything up to the claim, else on the primary.

        ``read`` must hand nothing on before it returns: a read the standby cancels for a recovery conflict,
        or that loses the standby, runs again in full on the primary, so no line is written twice. Raises what
        ``read`` raises on the primary.
        """
        if self._standby is not None:
            with contextlib.suppress(_GaveUp):
                return await self._on_standby(self._standby, read)
        self._servers.add("primary")
        async with self._primary.acquire() as conn:
            return await read(conn)

    def spare_connection(self) -> bool:
        """True when the pool the next read would use holds an idle connection: a read ahead takes only one
        of those, so that reading ahead never opens connections of its own (docs/deploy.md: Which parts may
        run as several replicas).
        """
        pool = self._standby if self._standby is not None else self._primary
        return bool(pool.get_idle_size() > 0)

    def finish(self) -> None:
        """Count this attempt's or chunk's reads by server: ``standby``, ``primary`` or ``both``."""
        if self._servers:
            server = "both" if len(self._servers) > 1 else next(iter(self._servers))
            metrics.EXPORT_READS.labels(server).inc()

    async def _on_standby(self, standby: asyncpg.Pool, read: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        try:
            async with standby.acquire() as conn:
                caught_up = await self._caught_up(conn)
                if caught_up is None:
                    self._give_up("not_standby")
                if not caught_up:
                    self._give_up("lag")
                if self._claim is not None:
                    if not await self._claim(conn):
                        self._give_up("claim_not_visible")
                    self._claim = None
                result = await read(conn)
        except _GaveUp:
            raise
        except Exception as exc:  # a read changes nothing: whatever failed here, the primary serves it
            self._give_up("conflict" if recovery_conflict(exc) else "unavailable", exc)
        self._servers.add("standby")
        return result

    async def _caught_up(self, conn: asyncpg.Connection) -> bool | None:
        """Wait until ``conn``'s server has replayed past the claim's position, polling until the deadline;
        None at once when the server is not a standby.
        """
        while not (caught_up := await conn.fetchval(_CAUGHT_UP_SQL, self._position)):
            if caught_up is None:
                return None
            if time.monotonic() >= self._deadline:
                return False
            await asyncio.sleep(REPLAY_POLL_SECONDS)
        return True

    def _give_up(self, reason: str, exc: BaseException | None = None) -> None:
        """Send the rest of these reads to the primary; raises ``_GaveUp``. Counted and logged once, by the
        first of the reads in flight together (``RangeReader``) that gives up.
        """
        if self._standby is not None:
            self._standby = None
            metrics.STANDBY_FALLBACKS.labels(reason).inc()
            log.warning(
                "export reads moved to the primary",
                extra={"reason": reason, "error": None if exc is None else type(exc).__name__},
            )
        raise _GaveUp(reason)


def recovery_conflict(exc: BaseException) -> bool:
    """True when ``exc``, or an error it came from, is one of ``RECOVERY_CONFLICTS``. Two ways hide the conflict:
    a standby that ends the session for it (a conflict that arrives between two messages of a statement is
    FATAL) makes asyncpg raise ``ConnectionDoesNotExistError`` with the server's error as its ``__cause__``;
    and the pool resets a connection as it takes it back, so a reset that fails on the ended session raises an
    error of its own with the conflict as its ``__context__``.
    """
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending:
        cause = pending.pop()
        if id(cause) in seen:
            continue
        seen.add(id(cause))
        if isinstance(cause, RECOVERY_CONFLICTS):
            return True
        pending.extend(e for e in (cause.__cause__, cause.__context__) if e is not None)
    return False


class _GaveUp(Exception):
    """The standby cannot serve these reads; they go to the primary."""
