"""The worker's side of the ``operations`` table: the lease, its fencing generation and every end of an
attempt (docs/states.md: States and failure model).

A claim takes the lease with generation + 1; every later write of the holder is fenced: it matches only
under the holder's generation while the operation is RUNNING (or, for the lease itself and the
cancellation's end, CANCEL_REQUESTED), so a holder that lost its lease changes nothing. A transition that
ends an attempt closes it in the same transaction (``attempts``). Every function runs on the caller's
connection, in the caller's transaction if any.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import asyncpg

from shared import tracing
from shared.db import atomic
from shared.export.phases import Phase
from shared.export.request import FIELDS, ExportRequest
from shared.repository.artifacts import ArtifactFiles
from shared.repository.attempts import close_attempt_if_matched, supersede_attempts
from shared.repository.rows import Row
from shared.states import LEASE_HELD, State, values


@dataclass(frozen=True)
class CurrentState:
    """Where an operation is now: its ``state`` and the fencing ``generation`` of its current or last lease."""

    state: State
    generation: int


async def current_state(conn: asyncpg.Connection, *, operation_id: str) -> CurrentState | None:
    """The operation's state and generation now; None when there is no such operation. Tells why a fenced
    write matched nothing, or whether a requeue may apply.
    """
    row = await conn.fetchrow("SELECT state, generation FROM operations WHERE operation_id = $1", operation_id)
    return None if row is None else CurrentState(State(row["state"]), row["generation"])


async def claim_visible(conn: asyncpg.Connection, *, operation_id: str, generation: int) -> bool:
    """Whether ``conn``'s server shows the operation under ``generation``: asked of a standby before an
    attempt reads there, since a standby that forked from the primary's history can have replayed past the
    claim's WAL position without holding the claim (docs/deploy.md: Export reads on a hot standby).
    """
    found: bool = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM operations WHERE operation_id = $1 AND generation = $2)", operation_id, generation
    )
    return found


@dataclass(frozen=True)
class ClaimedOperation(Row):
    """An operation whose lease a worker holds: what to export, the fencing ``generation`` that guards every
    write of the holder, and ``took_over``, whether the claim took the lease from a holder whose lease had
    expired.
    """

    operation_id: str
    owner_id: str
    conversation_id: str
    request: ExportRequest
    snapshot_max_seq: int
    generation: int
    attempt: int
    took_over: bool

    @classmethod
    def from_claim(cls, row: asyncpg.Record, *, took_over: bool) -> ClaimedOperation:
        """Build from a claim's ``RETURNING`` row (``_CLAIMED_COLUMNS``)."""
        return cls.from_row({**row, "request": ExportRequest.from_row(row), "took_over": took_over})

    def log_extra(self, **more: Any) -> dict[str, Any]:
        """The fields every log line about this attempt carries, and ``more``."""
        return {"operation_id": self.operation_id, "generation": self.generation, "attempt": self.attempt, **more}

    def span_attributes(self) -> dict[str, str | int]:
        """This attempt's attributes on a trace span (docs/monitoring.md: Monitoring, Traces)."""
        return {
            tracing.OPERATION_ID: self.operation_id,
            tracing.GENERATION: self.generation,
            tracing.ATTEMPT: self.attempt,
        }


# What a claim returns besides the snapshot: the operation and its whole request (``ExportRequest.from_row``).
_CLAIMED_COLUMNS = "o.operation_id, o.owner_id, o.conversation_id, o.generation, o.attempt, " + ", ".join(
    f"o.{name}" for name in FIELDS
)


@dataclass(frozen=True)
class ExportClaim:
    """What ``claim_export`` did: ``parked`` the operation, or ``claimed`` it (None: nothing to run) and found
    its owner a ``member`` of the conversation or not.
    """

    parked: bool
    claimed: ClaimedOperation | None
    member: bool


async def claim_export(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    worker_id: str,
    lease_seconds: float,
    max_attempts: int,
    message: str,
    key_stem: str,
    key_suffixes: str,
) -> ExportClaim:
    """A wake-up's claim in one call of the SQL function ``claim_export_v3`` (migrations 0017, 0026, 0029, 0032
    and 0033), atomic on its own (docs/states.md: States and failure model). ``lease_seconds`` in seconds; times
    are the database's.

    First it parks: a RUNNING operation whose lease expired after ``max_attempts`` attempts goes to
    FAILED_REPAIR with the error ``WORKER_LOST`` and ``message`` instead of being taken over, since every attempt
    lost its worker and another takeover would only risk the next one (the budget is spent); its last attempt is
    closed as LEASE_LOST with that code, and ``parked`` says so.

    Otherwise it takes the lease of a runnable operation with generation + 1 (``claimed``; None when there is
    nothing to run). Runnable (the SQL function ``operation_is_runnable``, migration 0004): QUEUED, RETRY_AT
    whose time has come, or RUNNING whose lease expired (a takeover). ``snapshot_max_seq``, the highest seq the
    file may hold, is fixed on the first claim and kept by every retry: the conversation's last seq, capped at
    ``before_seq - 1``, and ``after_seq`` when that leaves the range empty, so that an export of what came next
    starts there (docs/api.md: API reference). The same transaction opens the new generation's attempt, held by
    ``worker_id``, and closes an older one still open (``attempts.supersede_attempts``); ``took_over`` tells
    whether it closed one. When it claimed, ``member`` is the owner's membership, its row share-locked until
    the call's transaction ends, so that "still a member" and the lease are one decision.

    A claim also records the new generation's artifact WRITING, before its first byte
    (docs/architecture.md: How it works), under ``key_stem`` + the generation + the suffix ``key_suffixes`` (JSON,
    ``shared.storage.ARTIFACT_KEY_SUFFIXES``) gives the request's file, or ``/`` for a split result: the key
    ``shared.storage.artifact_key`` makes.
    """
    row = await conn.fetchrow(
        "SELECT parked, took_over, member, (claimed).* FROM claim_export_v3($1, $2, $3, $4, $5, $6, $7::jsonb)",
        operation_id,
        worker_id,
        lease_seconds,
        max_attempts,
        message,
        key_stem,
        key_suffixes,
    )
    return ExportClaim(parked=row["parked"], claimed=_claimed(row), member=bool(row["member"]))


def _claimed(row: asyncpg.Record) -> ClaimedOperation | None:
    """The claimed operation of a claim function's ``took_over, (claimed).*`` row; None when it claimed nothing
    (PL/pgSQL returns an unset composite as a row of NULLs).
    """
    if row["operation_id"] is None:
        return None
    return ClaimedOperation.from_claim(row, took_over=row["took_over"])


async def claim_cancellation(
    conn: asyncpg.Connection, *, operation_id: str, worker_id: str, lease_seconds: float
) -> ClaimedOperation | None:
    """Take the lease of a CANCEL_REQUESTED operation that no live worker holds (never claimed, waiting for
    a retry, or its holder's lease expired), with generation + 1, so that this worker removes what earlier
    generations left and writes CANCELED without waiting for a janitor pass (docs/states.md: States and failure
    model, Cancel). None when a live holder will finish it itself or it is in another state.

    No attempt is opened (it exports nothing and ``attempt`` stays); an attempt still open for an older
    generation is closed as LEASE_LOST, as a takeover closes it (``took_over`` then). ``snapshot_max_seq``
    is ``after_seq`` when it was never fixed.
    """
    async with atomic(conn):
        return await _take_lease(
            conn,
            """
            UPDATE operations o SET generation = o.generation + 1, lease_owner = $2,
                lease_expires_at = now() + make_interval(secs => $3)
            WHERE o.operation_id = $1 AND o.state = 'CANCEL_REQUESTED'
              AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
            RETURNING coalesce(o.snapshot_max_seq, o.after_seq) AS snapshot_max_seq, """,
            operation_id=operation_id,
            worker_id=worker_id,
            lease_seconds=lease_seconds,
        )


async def _take_lease(
    conn: asyncpg.Connection, update: str, *, operation_id: str, worker_id: str, lease_seconds: float
) -> ClaimedOperation | None:
    """Run a claim's ``update`` (parameters: the operation id, ``worker_id`` and ``lease_seconds``; its
    ``RETURNING`` ends with ``snapshot_max_seq,`` and gets ``_CLAIMED_COLUMNS`` appended) and, when it
    matched, close an attempt of an older generation still open; None when it matched nothing. Runs in the
    caller's transaction.
    """
    row = await conn.fetchrow(update + _CLAIMED_COLUMNS, operation_id, worker_id, lease_seconds)
    if row is None:
        return None
    took_over = await supersede_attempts(conn, operation_id=operation_id, generation=row["generation"])
    return ClaimedOperation.from_claim(row, took_over=took_over)


async def extend_lease(conn: asyncpg.Connection, *, operation_id: str, generation: int, lease_seconds: float) -> bool:
    """Heartbeat: push the lease end to now + ``lease_seconds``; False when the lease is no longer held.

    Also while CANCEL_REQUESTED: the holder still has objects to remove before CANCELED (docs/states.md: States and
    failure model, Cancel).
    """
    status = await conn.execute(
        """
        UPDATE operations SET lease_expires_at = now() + make_interval(secs => $3)
        WHERE operation_id = $1 AND generation = $2 AND state = ANY($4::text[])
        """,
        operation_id,
        generation,
        lease_seconds,
        values(LEASE_HELD),
    )
    return status == "UPDATE 1"


async def record_progress(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    generation: int,
    phase: Phase,
    messages_written: int,
    bytes_written: int,
    lease_seconds: float,
) -> bool:
    """Store measured progress and extend the lease; False when the lease is no longer held."""
    status = await conn.execute(
        """
        UPDATE operations SET progress_phase = $3, messages_written = $4, bytes_written = $5,
            lease_expires_at = now() + make_interval(secs => $6), updated_at = now()
        WHERE operation_id = $1 AND generation = $2 AND state = 'RUNNING'
        """,
        operation_id,
        generation,
        phase,
        messages_written,
        bytes_written,
        lease_seconds,
    )
    return status == "UPDATE 1"


async def record_estimate(conn: asyncpg.Connection, *, operation_id: str, generation: int, estimate_bytes: int) -> bool:
    """Show ``estimate_bytes``, the bytes the holder expects to store, in the operation (docs/api.md: Operations,
    Operation); False when the lease is no longer held."""
    status = await conn.execute(
        """
        UPDATE operations SET estimate_bytes = $3, updated_at = now()
        WHERE operation_id = $1 AND generation = $2 AND state = 'RUNNING'
        """,
        operation_id,
        generation,
        estimate_bytes,
    )
    return status == "UPDATE 1"


class SucceedOutcome(StrEnum):
    """What ``succeed_export`` did, as the SQL function ``succeed_export_v2`` answers it (migrations 0017, 0029)."""

    SUCCEEDED = "succeeded"
    NOT_MEMBER = "not_member"
    LEASE_LOST = "lease_lost"
    ARTIFACT_GONE = "artifact_gone"


async def succeed_export(
    conn: asyncpg.Connection,
    *,
    claimed: ClaimedOperation,
    files: ArtifactFiles,
    artifact_generation: int,
    result_ttl_seconds: int,
) -> SucceedOutcome:
    """RUNNING -> SUCCEEDED with the published ``files``, in one call of the SQL function ``succeed_export_v2``
    (migrations 0017, 0029 and 0032), atomic on its own (docs/states.md: States and failure model). Three checks, in
    order: the owner's membership, re-checked with its row share-locked (else NOT_MEMBER); the lease, the
    operation RUNNING under ``claimed``'s generation (else LEASE_LOST: the lease or the state moved on; a
    committed CANCEL_REQUESTED matches nothing either, so SUCCEEDED can never follow it, docs/states.md: States
    and failure model, Cancel); and the artifact of ``artifact_generation`` going to PUBLISHED with ``files``'
    figures (else ARTIFACT_GONE: it was removed meanwhile; the row lock this takes orders it against
    ``shared.artifact_removal.remove_artifact``): COMPLETE, or the lease's own still WRITING, so a file that was
    not recorded COMPLETE costs no round trip of its own. When ``artifact_generation`` is an earlier one
    (adopted), the lease's own record, which the claim made and nothing was written under, goes to DELETED.

    Nothing is written unless all three pass; then the attempt is closed as SUCCEEDED. An outcome other than
    SUCCEEDED leaves the caller's transaction, if any, usable. A split result has no size or sha256 of its own,
    only its parts' (docs/api.md: Submitting an export, Export options). Raises what asyncpg raises for a lost
    connection, when the outcome is unknown.
    """
    outcome: str = await conn.fetchval(
        "SELECT succeed_export_v2($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11, $12)",
        claimed.conversation_id,
        claimed.owner_id,
        artifact_generation,
        claimed.operation_id,
        claimed.generation,
        *_result(files, result_ttl_seconds),
    )
    return SucceedOutcome(outcome)


def _result(files: ArtifactFiles, result_ttl_seconds: int) -> tuple[Any, ...]:
    """The result's arguments of the SQL function ``succeed_export_v2`` after the operation and generation: key,
    size (bytes), sha256, message count, parts (JSON), time to live (seconds) and bytes written.
    """
    single = files.single
    return (
        files.key,
        None if single is None else single.size_bytes,
        None if single is None else single.sha256,
        files.message_count,
        files.parts_json(),
        float(result_ttl_seconds),
        files.size_bytes,
    )


async def end_attempt(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    generation: int,
    state: str,
    error_code: str,
    error_message: str,
    retry_delay_seconds: float | None = None,
) -> bool:
    """RUNNING -> FAILED, FAILED_REPAIR or RETRY_AT (with ``retry_delay_seconds``) and a readable error; the
    attempt is closed with that state as its outcome and ``error_code``.
    """
    async with atomic(conn):
        status = await conn.execute(
            """
            UPDATE operations SET state = $3, error_code = $4, error_message = $5,
                retry_at = CASE WHEN $6::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => $6) END,
                progress_phase = lower($3), lease_owner = NULL, lease_expires_at = NULL, updated_at = now(),
                finished_at = CASE WHEN $3 = 'RETRY_AT' THEN NULL ELSE now() END
            WHERE operation_id = $1 AND generation = $2 AND state = 'RUNNING'
            """,
            operation_id,
            generation,
            state,
            error_code,
            error_message,
            retry_delay_seconds,
        )
        return await close_attempt_if_matched(
            status, conn, operation_id=operation_id, generation=generation, outcome=state, error_code=error_code
        )


async def hand_back(conn: asyncpg.Connection, *, operation_id: str, generation: int) -> bool:
    """End our lease now, on a graceful stop, so another worker can take over at once (generation + 1).

    The interrupted attempt does not count against the retry budget: the next claim runs it again. The
    attempt is closed as HANDED_BACK.
    """
    async with atomic(conn):
        status = await conn.execute(
            """
            UPDATE operations SET lease_expires_at = now() - interval '1 millisecond',
                progress_phase = 'handed back', attempt = attempt - 1, updated_at = now()
            WHERE operation_id = $1 AND generation = $2 AND state = ANY($3::text[])
            """,
            operation_id,
            generation,
            values(LEASE_HELD),
        )
        return await close_attempt_if_matched(
            status, conn, operation_id=operation_id, generation=generation, outcome="HANDED_BACK"
        )


async def finish_cancel(conn: asyncpg.Connection, *, operation_id: str, generation: int, abandoned: bool) -> bool:
    """CANCEL_REQUESTED -> CANCELED once every object is gone (docs/states.md: States and failure model, Cancel);
    False when the operation moved on. By the holder of ``generation`` (its attempt closed as CANCELED), or,
    ``abandoned``, by the janitor for a cancellation nobody holds: then only while no live lease exists (a
    worker that took one finishes it itself) and an attempt still open, whose worker was lost, is closed as
    LEASE_LOST.
    """
    async with atomic(conn):
        status = await conn.execute(
            """
            UPDATE operations SET state = 'CANCELED', progress_phase = 'canceled', lease_owner = NULL,
                lease_expires_at = NULL, finished_at = now(), updated_at = now()
            WHERE operation_id = $1 AND generation = $2 AND state = 'CANCEL_REQUESTED'
              AND (NOT $3 OR lease_expires_at IS NULL OR lease_expires_at < now())
            """,
            operation_id,
            generation,
            abandoned,
        )
        outcome = "LEASE_LOST" if abandoned else "CANCELED"
        return await close_attempt_if_matched(
            status, conn, operation_id=operation_id, generation=generation, outcome=outcome
        )
