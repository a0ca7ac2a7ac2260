"""The janitor's passes. Each is idempotent and safe beside running workers: every state change is a
conditional UPDATE, and objects are deleted only after Postgres says nobody may serve them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import asyncpg

from services.janitor import repository as repo
from shared.artifacts import remove_artifact, remove_artifacts
from shared.outbox import enqueue_run
from shared.settings import Settings

log = logging.getLogger(__name__)

# Published outbox rows are kept this long for inspection, then deleted.
OUTBOX_KEEP_SECONDS = 24 * 3600.0


@dataclass
class PassReport:
    """What one pass did, for the pass's log line."""

    expired: int = 0
    purged: int = 0
    requeued: int = 0
    cancellations_finished: int = 0
    stale_artifacts_removed: int = 0
    outbox_rows_deleted: int = 0


class Janitor:
    """Runs the passes with the janitor's pool, S3 client and settings."""

    def __init__(self, *, pool: asyncpg.Pool, s3: Any, settings: Settings) -> None:
        self._pool = pool
        self._s3 = s3
        self._settings = settings

    async def run_pass(self) -> PassReport:
        """One full pass; returns what it did."""
        report = PassReport(
            expired=await self.expire_results(),
            requeued=await self.requeue_stranded(),
            cancellations_finished=await self.finish_abandoned_cancellations(),
            stale_artifacts_removed=await self.remove_stale_artifacts(),
        )
        async with self._pool.acquire() as conn:
            report.purged = await repo.purge(
                conn,
                retention_seconds=self._settings.operation_retention_seconds,
                limit=self._settings.janitor_batch_size,
            )
            report.outbox_rows_deleted = await repo.purge_published_outbox(conn, older_than_seconds=OUTBOX_KEEP_SECONDS)
        log.info("janitor pass", extra=asdict(report))
        return report

    async def expire_results(self) -> int:
        """SUCCEEDED -> EXPIRED past the result's retention, then delete its objects; return how many."""
        async with self._pool.acquire() as conn:
            expired = await repo.expire_results(conn, limit=self._settings.janitor_batch_size)
            for row in expired:
                await repo.record_deletion(conn, operation_id=row["operation_id"], owner_id=row["owner_id"])
        for row in expired:
            await self.remove_artifacts(row["operation_id"])
        return len(expired)

    async def requeue_stranded(self) -> int:
        """Send a new wake-up for expired leases, due retries and QUEUED operations whose message was lost."""
        async with self._pool.acquire() as conn, conn.transaction():
            stranded = await repo.stranded_operations(
                conn,
                quiet_seconds=self._settings.janitor_requeue_after_seconds,
                limit=self._settings.janitor_batch_size,
            )
            for operation_id in stranded:
                await enqueue_run(conn, operation_id=operation_id)
        if stranded:
            log.info("operations re-enqueued", extra={"count": len(stranded)})
        return len(stranded)

    async def finish_abandoned_cancellations(self) -> int:
        """Remove the objects of CANCEL_REQUESTED operations nobody holds, then mark them CANCELED (5.4)."""
        async with self._pool.acquire() as conn:
            candidates = await repo.abandoned_cancellations(conn, limit=self._settings.janitor_batch_size)
        finished = 0
        for row in candidates:
            if not await self.remove_artifacts(row["operation_id"]):
                continue
            async with self._pool.acquire() as conn:
                if await repo.finish_abandoned_cancel(
                    conn, operation_id=row["operation_id"], generation=row["generation"]
                ):
                    finished += 1
                    log.info("cancellation finished by the janitor", extra={"operation_id": row["operation_id"]})
        return finished

    async def remove_stale_artifacts(self) -> int:
        """Remove recorded artifacts that can never be published (a crashed or superseded attempt's
        object or open upload) once untouched for ``janitor_orphan_grace_seconds``; return how many.
        """
        async with self._pool.acquire() as conn:
            stale = await repo.stale_artifacts(
                conn, grace_seconds=self._settings.janitor_orphan_grace_seconds, limit=self._settings.janitor_batch_size
            )
        removed = [await self._remove_artifact(artifact) for artifact in stale]
        return sum(removed)

    async def remove_artifacts(self, operation_id: str) -> bool:
        """Delete every object and abort every upload recorded for ``operation_id``; True if all went."""
        return await remove_artifacts(self._pool, self._s3, bucket=self._settings.s3_bucket, operation_id=operation_id)

    async def _remove_artifact(self, artifact: Mapping[str, Any]) -> bool:
        try:
            return await remove_artifact(
                self._pool,
                self._s3,
                bucket=self._settings.s3_bucket,
                operation_id=artifact["operation_id"],
                generation=artifact["generation"],
            )
        except Exception:
            log.warning(
                "could not remove artifact",
                extra={"operation_id": artifact["operation_id"], "key": artifact["object_key"]},
            )
            return False
