"""The scheduler: the leading janitor fires every due schedule, each in a transaction of its own, every
``scheduler_interval_seconds`` (docs/schedules.md: Who fires them).

Leading only saves work. What keeps a run from being created twice is the database: one run per schedule
and due time (a unique constraint), at most one unfinished run per schedule, and the due time chosen inside
``schedule_runs.fire``'s transaction. So a frozen leader that wakes up after another janitor took over, or
anything else calling ``schedule_runs.fire``, at worst finds the run made (``DUPLICATE``, ``NOT_DUE``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import asyncpg

from services.janitor import metrics
from shared import tracing
from shared.db import TRANSIENT_DATABASE_ERRORS
from shared.ids import new_operation_id
from shared.repository import schedule_runs
from shared.repository.schedule_runs import FireOutcome
from shared.settings import JanitorPartSettings
from shared.timefmt import format_timestamp

log = logging.getLogger(__name__)

# Outcomes that change a schedule or create work: logged one by one. The others (the run is unfinished, the
# quota is full, someone fired first) repeat every round while they last and show on the schedule instead.
_LOGGED = frozenset({FireOutcome.CREATED, FireOutcome.ACCESS_REVOKED})


class Scheduler:
    """Fires due schedules with the janitor's pool and settings; ``run_round`` is one round."""

    def __init__(self, *, pool: asyncpg.Pool, settings: JanitorPartSettings) -> None:
        self._pool = pool
        self._settings = settings

    async def run_round(self, *, stop: asyncio.Event) -> Counter[str]:
        """Fire every due schedule, oldest due first, read in pages of ``janitor_batch_size``, until done or
        ``stop`` is set; return how many fires ended with each outcome (a ``FireOutcome`` value, or
        ``metrics.FIRE_FAILED``). A schedule waiting for its owner's quota is tried once a round, and those due
        after it are still reached: one user at the quota holds back no one else's.

        Raises the database's transient errors (``shared.db.TRANSIENT_DATABASE_ERRORS``): the next round
        tries again. Any other error of one fire is logged with its schedule and counted as failed, so that
        one schedule the database refuses does not stop the others.
        """
        outcomes: Counter[str] = Counter()
        page_size = self._settings.janitor_batch_size
        after: schedule_runs.DueSchedule | None = None
        while not stop.is_set():
            async with self._pool.acquire() as conn:
                page = await schedule_runs.due_schedules(conn, limit=page_size, after=after)
            for due in page:
                if stop.is_set():
                    break
                outcomes[await self._fire(due)] += 1
            if len(page) < page_size:
                break
            after = page[-1]
        if outcomes:
            log.debug("scheduler round", extra={"outcomes": dict(outcomes)})
        return outcomes

    async def _fire(self, due: schedule_runs.DueSchedule) -> str:
        """Fire one schedule (``schedule_runs.fire``: a transaction of its own) with a new operation id for its run;
        return the outcome as counted. The fire starts a trace, linked to the schedule's creation; a run it
        creates continues it (docs/monitoring.md: Monitoring, Traces).
        """
        schedule_id = due.schedule_id
        try:
            with tracing.span(
                "schedule fire", root=True, links=[due.traceparent], attributes={tracing.SCHEDULE_ID: schedule_id}
            ):
                async with self._pool.acquire() as conn:
                    result = await schedule_runs.fire(
                        conn,
                        schedule_id=schedule_id,
                        operation_id=new_operation_id(),
                        max_active=self._settings.max_active_exports,
                        traceparent=tracing.current_traceparent(),
                    )
        except TRANSIENT_DATABASE_ERRORS:
            raise
        except asyncpg.PostgresError as exc:
            log.exception("schedule fire failed", extra={"schedule_id": schedule_id, "error": type(exc).__name__})
            metrics.SCHEDULE_FIRES.labels(outcome=metrics.FIRE_FAILED).inc()
            return metrics.FIRE_FAILED
        metrics.SCHEDULE_FIRES.labels(outcome=result.outcome).inc()
        if result.outcome == FireOutcome.CREATED:
            metrics.SCHEDULE_RUNS_CREATED.inc()
        if result.outcome in _LOGGED:
            log.info(
                "schedule fired",
                extra={
                    "schedule_id": schedule_id,
                    "outcome": result.outcome,
                    "operation_id": result.operation_id,
                    "due_at": format_timestamp(result.due_at),
                },
            )
        return result.outcome
