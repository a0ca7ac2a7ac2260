"""The janitor's passes. Each is idempotent and safe beside running workers: every state change is a
conditional UPDATE, and objects are deleted only after Postgres says nobody may serve them.

Artifacts are reconciled from both ends (docs/architecture.md: How it works: every object or upload that is not the
published key is an orphan, removed after a grace period):

- from Postgres (``remove_stale_artifacts``): a recorded artifact that can never be published goes through
  ``shared.artifact_removal.remove_artifact``, which commits the record as REMOVING before S3 is touched and so
  conflicts on the artifact's row with an adoption's ``COMPLETE -> PUBLISHED``: exactly one of them wins;
- from S3 (``remove_orphan_objects``, ``abort_stale_uploads``): the bucket is listed under ``s3_prefix``
  and what no live record names is removed. This side decides from a listing and a separate read of the
  records, with no row to conflict on, so it leaves every key with a live record (WRITING, COMPLETE,
  PUBLISHED, REMOVING) to the record path: deleting such an object here could race an adoption into a
  SUCCEEDED without its file. A key with no record, or a DELETED one, is safe to delete: a key is recorded
  before its first byte is uploaded and a record never leaves DELETED, so it can never be published.
  A chunk's object is the exception: a chunk names its key before its first byte too, and the sweep leaves
  every key a chunk of a running or parked export names (docs/chunks.md: The janitor and chunks).

Attachments are reconciled the same way under ``s3_attachment_prefix`` (``reconcile_attachments``): an
upload's row is written before its first byte, so an object or multipart upload that no row names is an
orphan, and an upload still UPLOADING past the grace period lost its api (docs/retention.md: Orphan objects and
uploads).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import asyncpg

from services.janitor import metrics
from shared.artifact_removal import remove_artifact, remove_artifacts
from shared.repository import artifacts, attachments, chunks, message_store, outbox, sweeps
from shared.repository.access_events import record_access_event
from shared.repository.artifacts import LiveArtifact, StaleArtifact
from shared.repository.leases import finish_cancel
from shared.repository.outbox import enqueue_run
from shared.settings import JanitorPartSettings
from shared.states import ArtifactState, ChunkState
from shared.storage import (
    STORAGE_ERRORS,
    Entry,
    ListedObject,
    ListedUpload,
    ObjectPages,
    Pages,
    UploadPages,
    abort_upload,
    delete_keys,
    every_entry,
)

log = logging.getLogger(__name__)

# Published outbox rows are kept this long for inspection, then deleted.
OUTBOX_KEEP_SECONDS = 24 * 3600.0


@dataclass
class PassReport:
    """What one pass did, for the pass's log line; the metrics count the same events.

    ``requeued`` maps each of ``sweeps.REQUEUE_REASONS`` to the operations re-enqueued for it;
    ``unknown_state_artifacts`` is the part of ``stale_artifacts_removed`` that attempts left behind.
    """

    expired: int = 0
    requeued: dict[str, int] = field(default_factory=dict)
    cancellations_finished: int = 0
    stale_artifacts_removed: int = 0
    unknown_state_artifacts: int = 0
    orphan_objects_removed: int = 0
    stale_uploads_aborted: int = 0
    purged: int = 0
    outbox_rows_deleted: int = 0
    replaced_bodies_deleted: int = 0
    attachment_leftovers_removed: int = 0
    duration_seconds: float = 0.0


class Janitor:
    """Runs the passes with the janitor's pool, S3 client and settings.

    Keeps its place in the bucket listings from one pass to the next, so that a bucket larger than
    ``janitor_batch_size`` is swept in turn rather than always from its first key.
    """

    def __init__(self, *, pool: asyncpg.Pool, s3: Any, settings: JanitorPartSettings) -> None:
        self._pool = pool
        self._s3 = s3
        self._settings = settings
        self._objects = ObjectPages(s3, bucket=settings.s3_bucket, prefix=settings.s3_prefix)
        self._uploads = UploadPages(s3, bucket=settings.s3_bucket, prefix=settings.s3_prefix)
        self._attachment_objects = ObjectPages(s3, bucket=settings.s3_bucket, prefix=settings.s3_attachment_prefix)
        self._attachment_uploads = UploadPages(s3, bucket=settings.s3_bucket, prefix=settings.s3_attachment_prefix)

    async def run_pass(self) -> PassReport:
        """One full pass; returns what it did, logs it as one line and counts it. Raises the database's
        errors (the pass then counts as failed); storage errors only cut a step short.
        """
        report = PassReport()
        started = time.monotonic()
        try:
            await self._run_steps(report)
        except Exception:
            self._close(report, started, outcome="failed")
            raise
        self._close(report, started, outcome="ok")
        return report

    async def _run_steps(self, report: PassReport) -> None:
        report.expired = await self.expire_results()
        report.requeued = await self.requeue_stranded()
        report.cancellations_finished = await self.finish_abandoned_cancellations()
        stale = await self.remove_stale_artifacts()
        report.stale_artifacts_removed = len(stale)
        report.unknown_state_artifacts = sum(1 for artifact in stale if artifact.left_behind)
        report.orphan_objects_removed = await self.remove_orphan_objects()
        report.stale_uploads_aborted = await self.abort_stale_uploads()
        report.purged, report.outbox_rows_deleted = await self.purge()
        report.replaced_bodies_deleted = await self.prune_replaced_bodies()
        report.attachment_leftovers_removed = await self.reconcile_attachments()

    @staticmethod
    def _close(report: PassReport, started: float, *, outcome: str) -> None:
        report.duration_seconds = round(time.monotonic() - started, 3)
        metrics.PASSES.labels(outcome=outcome).inc()
        metrics.PASS_DURATION.observe(report.duration_seconds)
        level = logging.INFO if outcome == "ok" else logging.WARNING
        log.log(level, "janitor pass", extra={"outcome": outcome, **asdict(report)})

    async def expire_results(self) -> int:
        """SUCCEEDED -> EXPIRED past the result's retention, then delete its objects; return how many."""
        async with self._pool.acquire() as conn, conn.transaction():
            expired = await sweeps.expire_results(conn, limit=self._settings.janitor_batch_size)
            for row in expired:
                await record_access_event(
                    conn,
                    operation_id=row.operation_id,
                    user_id=row.owner_id,
                    action="delete_result",
                    outcome="EXPIRED",
                )
        metrics.RESULTS_EXPIRED.inc(len(expired))
        for row in expired:
            await self.remove_artifacts(row.operation_id)
        return len(expired)

    async def requeue_stranded(self) -> dict[str, int]:
        """Send a new wake-up for expired leases, due retries and QUEUED operations whose message was lost;
        return how many for each of ``sweeps.REQUEUE_REASONS``.
        """
        async with self._pool.acquire() as conn, conn.transaction():
            stranded = await sweeps.stranded_operations(
                conn,
                quiet_seconds=self._settings.janitor_requeue_after_seconds,
                limit=self._settings.janitor_batch_size,
            )
            for row in stranded:
                await enqueue_run(conn, operation_id=row.operation_id)
        requeued = dict.fromkeys(sweeps.REQUEUE_REASONS, 0)
        for row in stranded:
            requeued[row.reason] += 1
        for reason, count in requeued.items():
            metrics.OPERATIONS_REQUEUED.labels(reason=reason).inc(count)
        if stranded:
            log.info("operations re-enqueued", extra=requeued)
        return requeued

    async def finish_abandoned_cancellations(self) -> int:
        """Remove the objects of CANCEL_REQUESTED operations nobody holds, then mark them CANCELED (docs/states.md:
        States and failure model, Cancel)."""
        async with self._pool.acquire() as conn:
            candidates = await sweeps.abandoned_cancellations(conn, limit=self._settings.janitor_batch_size)
        finished = 0
        for row in candidates:
            if not await self.remove_artifacts(row.operation_id):
                continue
            async with self._pool.acquire() as conn:
                if await finish_cancel(conn, operation_id=row.operation_id, generation=row.generation, abandoned=True):
                    finished += 1
                    metrics.CANCELLATIONS_FINISHED_BY_JANITOR.inc()
                    log.info("cancellation finished by the janitor", extra={"operation_id": row.operation_id})
        return finished

    async def remove_stale_artifacts(self) -> list[asyncpg.Record]:
        """Remove recorded artifacts that can never be published (a crashed or superseded attempt's
        object or open upload) or an expired result's left-over, once untouched for
        ``janitor_orphan_grace_seconds``; return the removed ones as ``repository.stale_artifacts`` gives
        them. Those an attempt left behind (``left_behind``) are also counted by the state they were in.
        """
        async with self._pool.acquire() as conn:
            stale = await artifacts.stale_artifacts(
                conn, grace_seconds=self._settings.janitor_orphan_grace_seconds, limit=self._settings.janitor_batch_size
            )
        removed = [artifact for artifact in stale if await self._remove_artifact(artifact)]
        metrics.STALE_ARTIFACTS_REMOVED.inc(len(removed))
        for artifact in removed:
            if artifact.left_behind:
                metrics.UNKNOWN_STATE_ARTIFACTS.labels(state=artifact.state).inc()
        return removed

    async def remove_orphan_objects(self) -> int:
        """Delete the objects under ``s3_prefix`` older than ``janitor_orphan_grace_seconds`` (by their
        LastModified, on S3's clock) that no live artifact record names; return how many.

        Looks at up to ``janitor_batch_size`` objects, after those the previous pass looked at. Objects with a
        live record are the record path's (see the module's docstring); outside the prefix nothing is
        touched. The grace period keeps the sweep away from anything just written.
        """
        return await self._sweep(self._objects, self._delete_orphans)

    async def _delete_orphans(self, objects: list[ListedObject]) -> int:
        unrecorded = [item for item, record in await self._past_grace_with_records(objects) if record is None]
        # A chunk's object of a running or parked export is never redone once finished (docs/chunks.md).
        kept = await self._kept_chunk_keys(unrecorded)
        orphans = [item.key for item in unrecorded if item.key not in kept]
        deleted = await delete_keys(self._s3, bucket=self._settings.s3_bucket, keys=orphans)
        metrics.ORPHAN_OBJECTS_REMOVED.inc(len(deleted))
        if orphans:
            log.info("orphan objects removed", extra={"keys": deleted, "failed": len(orphans) - len(deleted)})
        return len(deleted)

    async def abort_stale_uploads(self) -> int:
        """Abort the multipart uploads under ``s3_prefix`` initiated more than ``janitor_orphan_grace_seconds``
        ago (on S3's clock) that nobody can complete; return how many.

        Abandoned: the key has no live record (no record, or DELETED), or its live record is past WRITING
        and names another upload id (its own upload was completed or is being removed; any other one was
        never recorded, such as a CreateMultipartUpload repeated after a lost answer). An upload of a live
        WRITING record is never touched, however old: a long export may upload for longer than the grace
        period, and its holder, a worker taking over, or the record path once the record is stale removes
        it. Looks at up to ``janitor_batch_size`` uploads, after those the previous pass looked at.
        """
        return await self._sweep(self._uploads, self._abort_abandoned)

    async def _abort_abandoned(self, uploads: list[ListedUpload]) -> int:
        candidates = [item for item, record in await self._past_grace_with_records(uploads) if _abandoned(item, record)]
        # A chunk's holder may upload for longer than the grace period.
        kept = await self._kept_chunk_keys(candidates)
        abandoned = [item for item in candidates if kept.get(item.key) != ChunkState.RUNNING]
        for upload in abandoned:
            # One aborted meanwhile by its holder or a removal is gone all the same.
            await abort_upload(self._s3, bucket=self._settings.s3_bucket, key=upload.key, upload_id=upload.upload_id)
            metrics.STALE_UPLOADS_ABORTED.inc()
        if abandoned:
            log.info("stale uploads aborted", extra={"keys": [upload.key for upload in abandoned]})
        return len(abandoned)

    async def _past_grace_with_records(self, entries: list[Entry]) -> list[tuple[Entry, asyncpg.Record | None]]:
        """The ``entries`` older than the grace period, each with its key's live record (None if none)."""
        old = self._past_grace(entries)
        if not old:
            return []
        async with self._pool.acquire() as conn:
            live = await artifacts.live_artifacts(conn, object_keys=[entry.key for entry in old])
        return [(entry, live.get(entry.key)) for entry in old]

    async def _kept_chunk_keys(self, entries: Sequence[Entry]) -> dict[str, ChunkState]:
        """Of ``entries``' keys, those a chunk of a running or parked export names, with its state."""
        if not entries:
            return {}
        async with self._pool.acquire() as conn:
            return await chunks.kept_keys(conn, object_keys=[entry.key for entry in entries])

    async def _sweep(self, pages: Pages[Entry], clean: Callable[[list[Entry]], Awaitable[int]]) -> int:
        """Hand ``pages`` to ``clean`` page by page until ``janitor_batch_size`` entries were listed or the
        listing ended; return the sum of what ``clean`` returned. A storage error ends the sweep for this
        pass (logged); the next pass resumes after the last page listed.
        """
        budget, done = self._settings.janitor_batch_size, 0
        try:
            while budget > 0:
                entries, more = await pages.next_page(budget)
                done += await clean(entries)
                budget -= len(entries)
                if not more:
                    break
        except STORAGE_ERRORS as exc:
            log.warning(
                "bucket sweep stopped by a storage error; the next pass goes on", extra={"error": type(exc).__name__}
            )
        return done

    async def purge(self) -> tuple[int, int]:
        """Delete ended records past the record retention and published outbox rows past
        ``OUTBOX_KEEP_SECONDS``; return (operations purged, outbox rows deleted).
        """
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                purged = await sweeps.purge(
                    conn,
                    retention_seconds=self._settings.operation_retention_seconds,
                    limit=self._settings.janitor_batch_size,
                )
                await outbox.delete_for(conn, operation_ids=purged)
            outbox_deleted = await outbox.purge_published(conn, older_than_seconds=OUTBOX_KEEP_SECONDS)
        metrics.RECORDS_PURGED.inc(len(purged))
        return len(purged), outbox_deleted

    async def prune_replaced_bodies(self) -> int:
        """Delete up to ``janitor_batch_size`` bodies that edits replaced and no export may still show
        (``message_store.prune_replaced_bodies``); return how many.
        """
        async with self._pool.acquire() as conn:
            deleted = await message_store.prune_replaced_bodies(conn, limit=self._settings.janitor_batch_size)
        metrics.REPLACED_BODIES_DELETED.inc(deleted)
        return deleted

    async def reconcile_attachments(self) -> int:
        """Remove what attachment uploads left behind: each upload still UPLOADING ``janitor_orphan_grace_seconds``
        after it began, its row first, then its object and multipart uploads; and the objects and multipart
        uploads under ``s3_attachment_prefix``, older than the grace period, that no row names. Return how many
        objects, uploads and rows went. A storage error ends it for this pass (logged).
        """
        removed = 0
        async with self._pool.acquire() as conn:
            unfinished = await attachments.take_unfinished_uploads(
                conn,
                grace_seconds=self._settings.janitor_orphan_grace_seconds,
                limit=self._settings.janitor_batch_size,
            )
        bucket = self._settings.s3_bucket
        try:
            for upload in unfinished:
                for left in await every_entry(UploadPages(self._s3, bucket=bucket, prefix=upload.object_key)):
                    await abort_upload(self._s3, bucket=bucket, key=left.key, upload_id=left.upload_id)
                await delete_keys(self._s3, bucket=bucket, keys=[upload.object_key])
                removed += 1
        except STORAGE_ERRORS as exc:
            # Their rows are gone: what is left is unrecorded, and the sweeps below (this pass or the next) take it.
            log.warning("attachment sweep stopped by a storage error", extra={"error": type(exc).__name__})
        removed += await self._sweep(self._attachment_objects, self._delete_unrecorded_attachments)
        removed += await self._sweep(self._attachment_uploads, self._abort_unrecorded_attachment_uploads)
        metrics.ATTACHMENT_LEFTOVERS_REMOVED.inc(removed)
        if removed:
            log.info("attachment leftovers removed", extra={"removed": removed})
        return removed

    def _past_grace(self, entries: Sequence[Entry]) -> list[Entry]:
        """The ``entries`` untouched for longer than ``janitor_orphan_grace_seconds`` (on S3's clock)."""
        return [entry for entry in entries if entry.age_seconds > self._settings.janitor_orphan_grace_seconds]

    async def _unrecorded_attachments(self, entries: Sequence[Entry]) -> list[Entry]:
        """The ``entries`` past the grace period that no attachment row names."""
        old = self._past_grace(entries)
        if not old:
            return []
        async with self._pool.acquire() as conn:
            recorded = await attachments.recorded_keys(conn, keys=[entry.key for entry in old])
        return [entry for entry in old if entry.key not in recorded]

    async def _delete_unrecorded_attachments(self, objects: list[ListedObject]) -> int:
        orphans = [entry.key for entry in await self._unrecorded_attachments(objects)]
        return len(await delete_keys(self._s3, bucket=self._settings.s3_bucket, keys=orphans))

    async def _abort_unrecorded_attachment_uploads(self, uploads: list[ListedUpload]) -> int:
        orphans = await self._unrecorded_attachments(uploads)
        for upload in orphans:
            await abort_upload(self._s3, bucket=self._settings.s3_bucket, key=upload.key, upload_id=upload.upload_id)
        return len(orphans)

    async def remove_artifacts(self, operation_id: str) -> bool:
        """Delete every object and abort every upload recorded for ``operation_id``; True if all went."""
        return await remove_artifacts(self._pool, self._s3, bucket=self._settings.s3_bucket, operation_id=operation_id)

    async def _remove_artifact(self, artifact: StaleArtifact) -> bool:
        try:
            return await remove_artifact(
                self._pool,
                self._s3,
                bucket=self._settings.s3_bucket,
                operation_id=artifact.operation_id,
                generation=artifact.generation,
            )
        except Exception:
            log.warning(
                "could not remove artifact",
                extra={"operation_id": artifact.operation_id, "key": artifact.object_key},
            )
            return False


def _abandoned(upload: ListedUpload, record: LiveArtifact | None) -> bool:
    """True when nobody can complete ``upload``, given its key's live record (see ``abort_stale_uploads``)."""
    if record is None:
        return True
    return record.state != ArtifactState.WRITING and record.upload_id != upload.upload_id
