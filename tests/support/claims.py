"""Leases taken and files recorded through the calls the worker makes (``leases.claim_export``, which records
the artifact, and ``artifacts.complete_artifact``), for tests of what a holder's writes may do.
"""

from __future__ import annotations

import asyncpg

from shared.repository import artifacts, leases
from shared.repository.artifacts import ArtifactFiles
from shared.repository.leases import ClaimedOperation
from shared.settings import StorageSettings
from shared.storage import ARTIFACT_KEY_SUFFIXES, artifact_key_stem
from tests.support.rows import S3_PREFIX

# A budget no test spends, so that a claim never parks the operation instead; a test of parking passes its own.
NEVER_PARKED = 1_000_000


async def claim_export(
    conn: asyncpg.Connection,
    operation_id: str,
    worker_id: str,
    *,
    lease_seconds: float,
    max_attempts: int = NEVER_PARKED,
) -> leases.ExportClaim:
    """A wake-up's claim of ``operation_id`` by ``worker_id``."""
    return await leases.claim_export(
        conn,
        operation_id=operation_id,
        worker_id=worker_id,
        lease_seconds=lease_seconds,
        max_attempts=max_attempts,
        message="lost",
        key_stem=artifact_key_stem(StorageSettings(s3_prefix=S3_PREFIX), operation_id),
        key_suffixes=ARTIFACT_KEY_SUFFIXES,
    )


async def claim(
    conn: asyncpg.Connection, operation_id: str, worker_id: str, *, lease_seconds: float
) -> ClaimedOperation:
    """The lease of ``operation_id`` that ``worker_id`` took; fails the test when there was nothing to run."""
    claimed = (await claim_export(conn, operation_id, worker_id, lease_seconds=lease_seconds)).claimed
    assert claimed is not None
    return claimed


async def verified_artifact(conn: asyncpg.Connection, claimed: ClaimedOperation, files: ArtifactFiles) -> None:
    """``files`` verified as the artifact the claim recorded for ``claimed``'s generation, as an export of more than
    one PutObject leaves them for its SUCCEEDED commit.
    """
    operation_id, generation = claimed.operation_id, claimed.generation
    assert await artifacts.complete_artifact(conn, operation_id=operation_id, generation=generation, files=files)
