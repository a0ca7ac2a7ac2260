"""What went wrong in an attempt, and what the operation does next (docs/states.md: States and failure model: retries).

Transient faults (S3 unreachable or 5xx, a lost database connection, timeouts) and unexpected errors
are retried with exponential backoff and jitter until the attempt budget is spent, then FAILED_REPAIR.
Permanent faults end the operation FAILED at once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import asyncpg
from botocore.exceptions import BotoCoreError, ClientError

from shared.db import TRANSIENT_DATABASE_ERRORS
from shared.object_writer import StoredBytesDiffer
from shared.repository import message_store
from shared.settings import WorkerPartSettings
from shared.states import State


class PermanentError(Exception):
    """An error no retry can fix; ``code`` is shown to the user in the operation's ``error``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class NeedsRepair(Exception):
    """A part of the export spent its own retry budget (a chunk, docs/chunks.md: Chunked exports): the
    operation is parked in FAILED_REPAIR with ``code`` and ``message``, whatever its own attempt count.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ArtifactGone(Exception):
    """The object to publish was removed before the SUCCEEDED transaction could take it (an adoption lost a
    race with a removal); the transaction is rolled back.
    """


def access_revoked() -> PermanentError:
    """The owner is no longer a member of the conversation (docs/states.md: States and failure model)."""
    return PermanentError("ACCESS_REVOKED", "You are no longer a member of this conversation.")


async def require_member(conn: asyncpg.Connection, *, conversation_id: str, user_id: str) -> None:
    """Raise ``access_revoked()`` unless ``user_id`` is a member of ``conversation_id`` now, read on ``conn``
    with the membership row locked, so that a removal waits for the caller's transaction.
    """
    if not await message_store.is_member(conn, conversation_id=conversation_id, user_id=user_id, lock=True):
        raise access_revoked()


@dataclass(frozen=True)
class Verdict:
    """How a failed attempt ends: the next state, its error, and the retry delay in seconds (RETRY_AT only)."""

    state: State
    code: str
    message: str
    retry_delay_seconds: float | None = None


def _describe(exc: BaseException) -> tuple[str, str]:
    """The error code and cause (a sentence without its full stop) of a failed attempt."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {}).get("Code")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if error == "NoSuchBucket":
            return "STORAGE_UNAVAILABLE", "The export bucket was missing from the file store"
        if status >= 500 or error in {"SlowDown", "RequestTimeout"}:
            return "STORAGE_UNAVAILABLE", "The file store answered with an error"
    elif isinstance(exc, StoredBytesDiffer):
        # Not an outage: the store answered, with other bytes than were sent (docs/states.md: States and failure
        # model). It spends an attempt like any fault a retry may fix, and has its own code so that an operator
        # looks at the store's integrity, not its reachability.
        return "STORED_BYTES_DIFFER", "The file store stored other bytes than were sent"
    elif isinstance(exc, BotoCoreError):
        return "STORAGE_UNAVAILABLE", "The file store could not be reached"
    elif isinstance(exc, TimeoutError):
        return "TIMEOUT", "A step of the export timed out"
    elif isinstance(exc, TRANSIENT_DATABASE_ERRORS):
        return "DATABASE_UNAVAILABLE", "The database connection was lost"
    return "INTERNAL_ERROR", "The export hit an unexpected error"


def error_name(exc: BaseException) -> str:
    """The exception's class, with S3's error code for a ``ClientError`` (``ClientError:SlowDown``): what an
    operator needs in the log to tell a missing bucket from an overloaded store.
    """
    if isinstance(exc, ClientError):
        return f"ClientError:{exc.response.get('Error', {}).get('Code', '?')}"
    return type(exc).__name__


def is_missing_bucket(exc: BaseException) -> bool:
    """True when ``exc`` says the bucket does not exist (a file store restarted empty, say)."""
    return isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") == "NoSuchBucket"


def classify(exc: BaseException, *, attempt: int, settings: WorkerPartSettings) -> Verdict:
    """Decide how attempt number ``attempt`` (1-based) that raised ``exc`` ends."""
    if isinstance(exc, PermanentError):
        return Verdict(State.FAILED, exc.code, exc.message)
    if isinstance(exc, NeedsRepair):
        return Verdict(State.FAILED_REPAIR, exc.code, exc.message)
    code, cause = _describe(exc)
    if attempt >= settings.max_attempts:
        budget = f"The retry budget of {settings.max_attempts} attempts is spent; an operator must requeue it."
        return Verdict(State.FAILED_REPAIR, code, f"{cause}. {budget}")
    return Verdict(State.RETRY_AT, code, f"{cause}; the export will be retried.", backoff_seconds(attempt, settings))


def backoff_seconds(attempt: int, settings: WorkerPartSettings) -> float:
    """Exponential backoff with equal jitter: half of min(cap, base * 2^(attempt-1)) plus a random half."""
    ceiling = min(settings.retry_cap_seconds, settings.retry_base_seconds * 2 ** (attempt - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)
