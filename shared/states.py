"""The operation state machine (docs/states.md: States and failure model).

Every transition is one conditional UPDATE on the expected state (and, for a lease holder, the fencing
generation). This module lists which moves exist and the sets of states the rules speak of; a statement that
tests a set passes it from here (``values``, ``sources_of``), and SQL names a state only alone (the worker's
fenced updates name their single source). A test compares every state the SQL and the migrations name with
this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class State(StrEnum):
    """States of an export operation (docs/states.md: States and failure model)."""

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    RETRY_AT = "RETRY_AT"
    CANCEL_REQUESTED = "CANCEL_REQUESTED"
    SUCCEEDED = "SUCCEEDED"
    CANCELED = "CANCELED"
    FAILED = "FAILED"
    FAILED_REPAIR = "FAILED_REPAIR"
    EXPIRED = "EXPIRED"


TRANSITIONS: dict[State, frozenset[State]] = {
    State.QUEUED: frozenset({State.RUNNING, State.CANCEL_REQUESTED}),
    # RUNNING -> RUNNING is a lease takeover: generation + 1.
    State.RUNNING: frozenset(
        {
            State.SUCCEEDED,
            State.RETRY_AT,
            State.FAILED,
            State.FAILED_REPAIR,
            State.CANCEL_REQUESTED,
            State.RUNNING,
        }
    ),
    State.RETRY_AT: frozenset({State.RUNNING, State.CANCEL_REQUESTED}),
    State.CANCEL_REQUESTED: frozenset({State.CANCELED}),
    State.SUCCEEDED: frozenset({State.EXPIRED}),
    State.FAILED_REPAIR: frozenset({State.QUEUED}),
    State.CANCELED: frozenset(),
    State.FAILED: frozenset(),
    State.EXPIRED: frozenset(),
}

# "Terminal" as the client sees it: no Retry-After, and no longer counted by the active-export quota.
# FAILED_REPAIR is parked, not final, but nothing happens to it without an operator.
TERMINAL: frozenset[State] = frozenset(
    {State.SUCCEEDED, State.CANCELED, State.FAILED, State.FAILED_REPAIR, State.EXPIRED}
)
ACTIVE: frozenset[State] = frozenset(State) - TERMINAL
# The states an export ends in for its owner (its completion callback is sent, migration 0006): no attempt
# runs or will publish a file any more. EXPIRED comes later, to a SUCCEEDED one.
ENDED: frozenset[State] = TERMINAL - {State.EXPIRED}
# The states whose records the janitor purges once retained long enough (docs/retention.md: Retention periods): a
# SUCCEEDED result is served until it has EXPIRED first.
PURGEABLE: frozenset[State] = TERMINAL - {State.SUCCEEDED}
# The states in which an attempt may still write the export's file: FAILED_REPAIR comes back by an operator's
# requeue with the snapshot it had (docs/api.md: Message store, Replies and edits: the bodies it may show are kept).
MAY_WRITE_AGAIN: frozenset[State] = ACTIVE | {State.FAILED_REPAIR}
# The states in which a lease holder still writes its heartbeat and may hand its lease back: while
# CANCEL_REQUESTED it still has objects to remove before CANCELED (docs/states.md: States and failure model, Cancel).
LEASE_HELD: frozenset[State] = frozenset({State.RUNNING, State.CANCEL_REQUESTED})


def values(states: Iterable[StrEnum]) -> list[str]:
    """``states`` as sorted strings, for a SQL ``state = ANY($n::text[])``."""
    return sorted(state.value for state in states)


def sources_of(target: State) -> list[str]:
    """The states from which ``target`` may be entered, as strings for a SQL ``state = ANY($n)``."""
    return values(source for source, targets in TRANSITIONS.items() if target in targets)


class ArtifactState(StrEnum):
    """States of an artifact record, one per generation's object (docs/states.md: States and failure model):
    WRITING (key recorded, uploading) -> COMPLETE (uploaded and verified) -> PUBLISHED (the result of a
    SUCCEEDED operation); any but a served PUBLISHED -> REMOVING (committed before S3 is cleaned) ->
    DELETED.
    """

    WRITING = "WRITING"
    COMPLETE = "COMPLETE"
    PUBLISHED = "PUBLISHED"
    REMOVING = "REMOVING"
    DELETED = "DELETED"


class AttachmentState(StrEnum):
    """States of an attachment's record (docs/api.md: Message store, Attachments): UPLOADING (recorded before its
    first byte is stored) -> STORED (complete, measured); an upload that never finishes loses its record.
    """

    UPLOADING = "UPLOADING"
    STORED = "STORED"


# Artifacts an attempt can leave behind when its worker is lost: the janitor counts them by state.
LEFT_BEHIND: tuple[ArtifactState, ...] = (ArtifactState.WRITING, ArtifactState.COMPLETE, ArtifactState.REMOVING)


class ChunkState(StrEnum):
    """States of one chunk of a chunked export (docs/chunks.md: Chunked exports): PENDING (planned, or handed
    back, or waiting for its retry's ``not_before``) -> QUEUED (its wake-up is in the outbox) -> RUNNING (a
    worker holds its lease) -> DONE (its output recorded, never redone); RUNNING -> PENDING on a transient
    error or a hand-back, -> FAILED once its attempt budget is spent (the operation is then parked).
    """

    PENDING = "PENDING"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    DONE = "DONE"
    FAILED = "FAILED"


# Chunks a worker may claim: woken or not yet, or held by a lease that may have expired (the claim checks).
CLAIMABLE_CHUNKS: frozenset[ChunkState] = frozenset({ChunkState.PENDING, ChunkState.QUEUED, ChunkState.RUNNING})


class ScheduleState(StrEnum):
    """Where an export schedule is (docs/schedules.md: The resource): it creates runs only while ACTIVE."""

    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"


class PauseReason(StrEnum):
    """Why a schedule is PAUSED (docs/schedules.md: When a run cannot go on): its owner paused it, the owner is no
    longer a member of the conversation, or a run waits for an operator (FAILED_REPAIR).
    """

    USER = "USER"
    ACCESS_REVOKED = "ACCESS_REVOKED"
    RUN_NEEDS_REPAIR = "RUN_NEEDS_REPAIR"


class WaitingReason(StrEnum):
    """Why a due run of an ACTIVE schedule is not created yet (docs/schedules.md: Runs): the owner's active
    exports are at the quota; the run is created once one ends.
    """

    ACTIVE_EXPORT_QUOTA = "ACTIVE_EXPORT_QUOTA"


class ScheduleMode(StrEnum):
    """How a schedule's runs choose their range (docs/schedules.md: The chain), the default first: each after the
    chain's watermark, or each the whole selection again.
    """

    INCREMENTAL = "incremental"
    FULL = "full"
