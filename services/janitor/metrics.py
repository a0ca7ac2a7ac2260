"""The janitor's Prometheus metrics: what its passes and its scheduler do, whether this process leads, and the
system gauges (operations by state, the outbox backlog, schedules by state) read from Postgres when
``observe_system`` runs.

Counters count what a pass or a fire did, each once, when it is done: they move only in the leading janitor.
"""

from __future__ import annotations

import asyncpg
from prometheus_client import Counter, Gauge, Histogram

from shared.db import probing_connection
from shared.metrics import CANCELLATIONS_FINISHED, counter_from_zero
from shared.repository import chunks, outbox, schedule_runs, sweeps
from shared.states import LEFT_BEHIND, ChunkState, State

# The states a record left behind by an attempt can be found in (see ``repository.stale_artifacts``).
LEFT_BEHIND_STATES = tuple(state.value for state in LEFT_BEHIND)

RESULTS_EXPIRED = Counter(
    "chatexport_janitor_results_expired_total",
    "SUCCEEDED operations moved to EXPIRED once their result's retention ended.",
)
OPERATIONS_REQUEUED = counter_from_zero(
    "chatexport_janitor_operations_requeued_total",
    "New wake-ups sent for stranded operations: lease_expired (RUNNING, its worker gone), retry_due"
    " (RETRY_AT past retry_at) or message_lost (QUEUED with no wake-up on its way).",
    "reason",
    sweeps.REQUEUE_REASONS,
)
CANCELLATIONS_FINISHED_BY_JANITOR = CANCELLATIONS_FINISHED.labels(by="janitor")
STALE_ARTIFACTS_REMOVED = Counter(
    "chatexport_janitor_stale_artifacts_removed_total",
    "Recorded artifacts removed once nobody could publish or serve them: left behind by an attempt, or an"
    " expired result whose deletion had failed.",
)
UNKNOWN_STATE_ARTIFACTS = counter_from_zero(
    "chatexport_janitor_unknown_state_artifacts_total",
    "Of the stale artifacts removed, those an attempt left behind: its operation moved to a newer generation"
    " or ended without publishing them or finishing their removal; by the state the record was found in.",
    "state",
    LEFT_BEHIND_STATES,
)
ORPHAN_OBJECTS_REMOVED = Counter(
    "chatexport_janitor_orphan_objects_removed_total",
    "Objects under the prefix, older than the grace period, deleted because no live artifact record names them.",
)
STALE_UPLOADS_ABORTED = Counter(
    "chatexport_janitor_stale_uploads_aborted_total",
    "Multipart uploads under the prefix, initiated before the grace period, aborted because nobody can complete them.",
)
RECORDS_PURGED = Counter(
    "chatexport_janitor_records_purged_total",
    "Ended operation records deleted after the record retention, with their keys and artifact records.",
)
REPLACED_BODIES_DELETED = Counter(
    "chatexport_janitor_replaced_bodies_deleted_total",
    "Message bodies that edits replaced, deleted once no export may still show them.",
)
ATTACHMENT_LEFTOVERS_REMOVED = Counter(
    "chatexport_janitor_attachment_leftovers_removed_total",
    "Objects, multipart uploads and rows that unfinished or forgotten attachment uploads left, removed.",
)
PASSES = counter_from_zero(
    "chatexport_janitor_passes_total",
    "Janitor passes, by outcome (ok or failed).",
    "outcome",
    ("ok", "failed"),
)
PASS_DURATION = Histogram(
    "chatexport_janitor_pass_duration_seconds",
    "Wall time of one janitor pass, failed ones included.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
)
LEADER = Gauge("chatexport_janitor_leader", "1 while this process holds the janitor's leader lock, else 0.")

OPERATIONS = Gauge("chatexport_operations", "Operation records by state, as Postgres holds them now.", ["state"])
# States whose operations wait on something: how long the oldest has waited tells work is stuck.
WAITING_STATES = (State.QUEUED, State.RUNNING, State.RETRY_AT, State.CANCEL_REQUESTED, State.FAILED_REPAIR)
OPERATION_OLDEST_AGE = Gauge(
    "chatexport_operation_oldest_age_seconds",
    "Seconds since the oldest operation in this state was last updated (for RUNNING: its last progress"
    " write); 0 when there is none.",
    ["state"],
)
OUTBOX_BACKLOG = Gauge("chatexport_outbox_backlog", "Outbox rows not yet published to the broker.")
OUTBOX_OLDEST_AGE = Gauge(
    "chatexport_outbox_oldest_age_seconds",
    "Seconds the longest-waiting due outbox row has waited since it became due (a retry's row is due at its"
    " not-before time); 0 when there is none.",
)

CHUNKS = Gauge(
    "chatexport_export_chunks",
    "Chunks of running or parked chunked exports by state (docs/chunks.md), as Postgres holds them now.",
    ["state"],
)

SCHEDULES = Gauge(
    "chatexport_schedules",
    "Export schedules by state (ACTIVE, PAUSED), and WAITING: the ACTIVE ones whose run waits for the owner's"
    " active-export quota; as Postgres holds them now.",
    ["state"],
)
SCHEDULE_DUE_LAG = Gauge(
    "chatexport_schedule_due_lag_seconds",
    "Seconds the longest-overdue schedule that can fire (ACTIVE, no unfinished run) has been due; 0 when none is.",
)
SCHEDULE_RUNS_CREATED = Counter(
    "chatexport_schedule_runs_created_total",
    "Runs created by the scheduler, at most one per schedule and due time.",
)
# A fire the database refused for a reason that is not transient: logged with its schedule, the round goes on.
FIRE_FAILED = "failed"
SCHEDULE_FIRES = counter_from_zero(
    "chatexport_schedule_fires_total",
    "Fires of due schedules by outcome: created (a run), not_due (fired meanwhile, or a run unfinished),"
    " waiting_for_quota, access_revoked (paused), duplicate (the run existed already),"
    " failed (an error, logged).",
    "outcome",
    (*(outcome.value for outcome in schedule_runs.FireOutcome), FIRE_FAILED),
)


async def observe_system(pool: asyncpg.Pool) -> None:
    """Set the system gauges from four short queries read as of one snapshot (``sweeps.state_figures``,
    ``outbox.backlog``, ``chunks.chunk_figures`` and ``schedule_runs.schedule_figures``, database clock): every state's
    operation count (0 when none), the oldest age in each of ``WAITING_STATES``, the outbox backlog with its
    oldest due row's age, the chunks of running or parked exports by state, and the schedules by state with
    the oldest due one's lag. Meant to run before each scrape of the metrics endpoint; raises the driver's
    errors (``asyncpg.PostgresError``, ``OSError``, timeouts), leaving the gauges as they were.
    """
    async with probing_connection(pool) as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        figures = await sweeps.state_figures(conn)
        backlog, oldest_due = await outbox.backlog(conn)
        chunk_counts = await chunks.chunk_figures(conn)
        schedule_figures = await schedule_runs.schedule_figures(conn)
    for chunk_state in ChunkState:
        CHUNKS.labels(state=chunk_state).set(chunk_counts.get(chunk_state, 0))
    by_state = {figure.state: figure for figure in figures}
    for state in State:
        OPERATIONS.labels(state=state).set(by_state[state].operations if state in by_state else 0)
    for state in WAITING_STATES:
        OPERATION_OLDEST_AGE.labels(state=state).set(by_state[state].oldest_age_seconds if state in by_state else 0.0)
    OUTBOX_BACKLOG.set(backlog)
    OUTBOX_OLDEST_AGE.set(oldest_due)
    for schedule_state, count in schedule_figures.by_state.items():
        SCHEDULES.labels(state=schedule_state).set(count)
    SCHEDULE_DUE_LAG.set(schedule_figures.oldest_due_lag_seconds)
