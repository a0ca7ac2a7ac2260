"""Submitting an export (README: API reference, Submit): idempotency, quota, and the one transaction that creates it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

from services.api.metrics import IDEMPOTENCY_CONFLICTS
from services.api.problems import Problem
from shared.fingerprint import ExportRequest, fingerprint
from shared.ids import new_operation_id
from shared.repository import idempotency_keys, operations
from shared.repository.outbox import enqueue_run
from shared.settings import Settings

log = logging.getLogger(__name__)

QUOTA_RETRY_AFTER_SECONDS = 10


@dataclass(frozen=True)
class Submitted:
    """The operation a submission answers with, and whether it was a replay of an earlier one."""

    operation_id: str
    replayed: bool


async def submit(
    conn: asyncpg.Connection,
    settings: Settings,
    *,
    owner_id: str,
    conversation_id: str,
    idempotency_key: str,
    request: ExportRequest,
) -> Submitted:
    """Create the export, or find the one this key already created; run inside the caller's transaction.

    The caller has checked membership. Raises ``Problem`` IDEMPOTENCY_KEY_REUSED / IDEMPOTENCY_KEY_EXPIRED
    (409) or TOO_MANY_ACTIVE_EXPORTS (429); on success the operation, its idempotency record and its outbox
    row commit together with the caller's transaction.
    """
    await operations.lock_owner(conn, owner_id=owner_id)
    request_fingerprint = fingerprint(user_id=owner_id, conversation_id=conversation_id, request=request)
    earlier = await idempotency_keys.find_idempotency_key(
        conn,
        owner_id=owner_id,
        idempotency_key=idempotency_key,
        replay_window_seconds=settings.idempotency_replay_window_seconds,
    )
    if earlier is not None:
        return _replay(earlier, request_fingerprint)
    if await operations.count_active(conn, owner_id=owner_id) >= settings.max_active_exports:
        raise Problem(
            "TOO_MANY_ACTIVE_EXPORTS",
            f"You already have {settings.max_active_exports} exports in progress; retry when one has ended.",
            headers={"Retry-After": str(QUOTA_RETRY_AFTER_SECONDS)},
        )
    operation_id = new_operation_id()
    await operations.insert_operation(
        conn, operation_id=operation_id, owner_id=owner_id, conversation_id=conversation_id, request=request
    )
    await idempotency_keys.insert_idempotency_key(
        conn,
        owner_id=owner_id,
        idempotency_key=idempotency_key,
        fingerprint=request_fingerprint,
        operation_id=operation_id,
    )
    await enqueue_run(conn, operation_id=operation_id)
    log.info("export submitted", extra={"operation_id": operation_id, "conversation_id": conversation_id})
    return Submitted(operation_id=operation_id, replayed=False)


def _replay(earlier: asyncpg.Record, request_fingerprint: str) -> Submitted:
    if earlier["fingerprint"] != request_fingerprint:
        raise _conflict(
            "IDEMPOTENCY_KEY_REUSED", "This Idempotency-Key was already used for a different request; use a new key."
        )
    if earlier["expired"]:
        raise _conflict(
            "IDEMPOTENCY_KEY_EXPIRED",
            "This Idempotency-Key is past its replay window; use a new key to start a new export.",
        )
    return Submitted(operation_id=earlier["operation_id"], replayed=True)


def _conflict(code: str, detail: str) -> Problem:
    IDEMPOTENCY_CONFLICTS.labels(code).inc()
    return Problem(code, detail)
