"""One export attempt's work under a lease: find an earlier generation's verified file to adopt, or read the
messages in seq ranges, stream them into S3 and verify what S3 stored; return what is to be published. The
runner (``services.worker.operation.runner``) commits SUCCEEDED with it, as it records every other end
(docs/api.md: Submitting an export, The file; States and failure model; How it works).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
from botocore.exceptions import ClientError

from services.worker import metrics
from services.worker.chunked.assembly import Checkpoint
from services.worker.chunked.coordinator import ChunkedExport
from services.worker.chunked.plan import ChunkPlanner
from services.worker.writing.files import Destination, FileSet
from services.worker.writing.ranges import RangeReader
from services.worker.writing.read_source import ReadSource
from shared.artifact_removal import remove_artifact
from shared.export.media import MediaPlan, plan_media
from shared.export.phases import Phase
from shared.lease import LeaseLost
from shared.logs import update_log_fields
from shared.object_writer import ObjectWriter, read_digest
from shared.repository import artifacts, export_reader, leases
from shared.repository.artifacts import ArtifactFiles, ArtifactRecord
from shared.repository.leases import ClaimedOperation
from shared.settings import WorkerPartSettings
from shared.states import ArtifactState
from shared.storage import artifact_key

log = logging.getLogger(__name__)

# The least time between two progress writes of an attempt after its first (docs/api.md: Operations, Operation).
PROGRESS_INTERVAL_SECONDS = 1.0
# The fencing generation of an operation's first claim (every claim adds one to the column's 0).
FIRST_GENERATION = 1
# The time of a ZIP's members when the export holds no message: the earliest a ZIP can record.
ZIP_EPOCH = datetime(1980, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Written:
    """What an attempt has to publish: the verified ``files`` of ``generation``, the attempt's own or, when
    ``adopted``, an earlier generation's that S3 still holds exactly as verified.
    """

    generation: int
    files: ArtifactFiles
    adopted: bool


@dataclass(frozen=True)
class Resumed:
    """An earlier generation's assembly that this attempt takes up (docs/chunks.md: Chunked exports, A
    coordinator's takeover): the ``generation`` and ``key`` of its record and its last ``checkpoint``.
    """

    generation: int
    key: str
    checkpoint: Checkpoint


class ExportJob:
    """The work of one attempt for ``claimed`` (``write``); raises ``LeaseLost``, ``PermanentError`` or a
    transient error.
    """

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        s3: Any,
        settings: WorkerPartSettings,
        claimed: ClaimedOperation,
        reads: ReadSource | None = None,
    ) -> None:
        self._pool = pool
        self._s3 = s3
        self._settings = settings
        self._claimed = claimed
        request = claimed.request
        self._kind = request.file_kind
        self._split = request.max_part_bytes is not None
        self.key = artifact_key(
            settings, claimed.operation_id, claimed.generation, extension=self._kind.extension, split=self._split
        )
        # Standby reads only where the claim shows (docs/deploy.md: Export reads on a hot standby).
        reads = (reads or ReadSource(primary=pool)).claimed(
            lambda conn: leases.claim_visible(conn, operation_id=claimed.operation_id, generation=claimed.generation)
        )
        self._reader = RangeReader(
            source=reads,
            settings=settings,
            operation_id=claimed.operation_id,
            conversation_id=claimed.conversation_id,
            request=request,
            kind=self._kind,
            split=self._split,
        )
        self._destination = Destination(self.key, self._kind, claimed.conversation_id, request.max_part_bytes)
        self._files = FileSet(s3, settings, self._destination)
        self._planner = ChunkPlanner(
            pool=pool, settings=settings, claimed=claimed, last_seq=last_seq(claimed), reads=reads
        )
        self._recorded_upload_id: str | None = None
        # The generation whose artifact record holds this attempt's file: its own, or the one it resumed.
        self._artifact_generation = claimed.generation
        self._zip_writers: list[ObjectWriter] = []
        # The claim wrote ``starting``: an export that ends within the interval writes no progress at all.
        self._progress_written_at = time.monotonic()
        self.chunked = False  # whether ``write`` wrote the file from chunks

    async def write(self) -> Written:
        """An earlier generation's verified files to adopt, or this attempt's own, written and verified (its
        record COMPLETE, except a file of one PutObject, which the SUCCEEDED commit publishes from WRITING); on
        any failure remove what this attempt uploaded. Call it once per job.
        """
        earlier = await self._settle_earlier_generations()
        if isinstance(earlier, Written):
            return earlier
        claimed = self._claimed
        # An export with media is one stream, never chunks (docs/api.md: Submitting an export, Exports with media).
        planned = [] if claimed.request.media else await self._planner.plan()
        self.chunked = bool(planned)
        # The claim recorded the artifact WRITING under ``self.key`` (``leases.claim_export``).
        destination = self._destination
        if earlier is not None and planned:
            await self._take_up(earlier)
            destination = dataclasses.replace(destination, key=earlier.key)
        elif earlier is not None:
            await self._remove(earlier.generation)  # a checkpoint of chunks this attempt does not write
            earlier = None
        try:
            if planned:
                # Built only for an export the plan chunked: most are written in one stream.
                coordinator = ChunkedExport(
                    pool=self._pool, s3=self._s3, settings=self._settings, claimed=claimed, progress=self._progress
                )
                files = await coordinator.write(
                    destination,
                    on_upload=self._record_assembly_upload,
                    on_checkpoint=self._record_checkpoint,
                    resume=None if earlier is None else earlier.checkpoint,
                )
            elif claimed.request.media:
                files = await self._write_zip()
            else:
                await self._write_messages()
                await self._progress(Phase.UPLOADING)
                # SUCCEEDED promises verified files (docs/states.md: States and failure model): each writer
                # checks what S3 stored against what it sent (``ObjectWriter.finish``).
                files = ArtifactFiles(self.key, tuple(await self._files.finish()), split=self._split)
                await self._record_upload_id()
            if planned or claimed.request.media or self._split or self._recorded_upload_id is not None:
                # Recorded COMPLETE, so that a takeover after an unknown outcome adopts it rather than writing
                # it again; a file of one PutObject costs less to rewrite than this round trip on every export,
                # and the SUCCEEDED commit publishes it from WRITING (docs/states.md: States and failure
                # model, Unknown outcomes).
                await self._complete(files)
        except BaseException:
            await asyncio.shield(self.discard(self._artifact_generation))
            raise
        return Written(self._artifact_generation, files, adopted=False)

    async def _settle_earlier_generations(self) -> Written | Resumed | None:
        """After a takeover, the newest earlier generation's complete files if S3 still holds exactly what was
        verified, else the newest assembly that can be resumed from its checkpoint; every other earlier object
        and upload is removed (docs/states.md: States and failure model, Unknown outcomes; docs/chunks.md:
        Chunked exports, A coordinator's takeover). Raises ``LeaseLost`` when taking up an assembly is refused.
        """
        claimed = self._claimed
        if claimed.generation == FIRST_GENERATION:
            return None  # no generation came before it: nothing to look up
        async with self._pool.acquire() as conn:
            earlier = await artifacts.unremoved_artifacts(
                conn, operation_id=claimed.operation_id, below_generation=claimed.generation
            )
        resumed: Resumed | None = None
        for artifact in earlier:
            if artifact.state == ArtifactState.COMPLETE and await self._still_stored(artifact):
                if resumed is not None:
                    await self._remove(resumed.generation)
                return Written(artifact.generation, artifact.files(), adopted=True)
            if resumed is None and (resumed := await self._resumable(artifact)) is not None:
                continue
            removed = await self._remove(artifact.generation)
            if removed:
                metrics.EARLIER_ARTIFACTS_REMOVED.inc()
            log.info(
                "earlier generation's artifact removed" if removed else "earlier generation's artifact kept",
                extra=claimed.log_extra(artifact_generation=artifact.generation, artifact_state=artifact.state),
            )
        return resumed

    async def _take_up(self, resumed: Resumed) -> None:
        """Make ``resumed``'s record the one that holds this attempt's file, its checkpoint recorded again under
        this lease (which also tells the janitor the record is in use); raises ``LeaseLost``.
        """
        self._artifact_generation = resumed.generation
        await self._record_checkpoint(resumed.checkpoint)
        metrics.ASSEMBLIES_RESUMED.inc()
        log.info(
            "assembly resumed from its checkpoint",
            extra=self._claimed.log_extra(
                artifact_generation=resumed.generation,
                resumed_at_bytes=resumed.checkpoint.size_bytes,
                parts=len(resumed.checkpoint.parts),
            ),
        )

    async def _resumable(self, artifact: ArtifactRecord) -> Resumed | None:
        """``artifact``'s assembly to take up: a WRITING record with a checkpoint of a version this release
        knows, whose upload S3 still holds; None otherwise.
        """
        if artifact.state != ArtifactState.WRITING or artifact.assembly is None:
            return None
        checkpoint = Checkpoint.from_json(artifact.assembly)
        if checkpoint is None:
            return None
        try:
            await self._s3.list_parts(
                Bucket=self._settings.s3_bucket, Key=artifact.object_key, UploadId=checkpoint.upload_id, MaxParts=1
            )
        except self._s3.exceptions.NoSuchUpload:
            return None
        return Resumed(artifact.generation, artifact.object_key, checkpoint)

    async def _still_stored(self, artifact: ArtifactRecord) -> bool:
        """True when S3 holds every file of the COMPLETE ``artifact`` with its recorded size and sha256."""
        for part in artifact.files().parts:
            try:
                stored = await read_digest(self._s3, bucket=self._settings.s3_bucket, key=part.key)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
                    raise
                return False
            # The same size and sha256 are the same bytes, so every count made of them still holds.
            if (stored.size_bytes, stored.sha256) != (part.size_bytes, part.sha256):
                return False
        return True

    async def _write_messages(self) -> None:
        """Read the selected messages into the files (``RangeReader.write``), recording the upload and the
        progress after each range.
        """
        await self._reader.write(
            self._files,
            after=self._claimed.request.after_seq,
            last=last_seq(self._claimed),
            after_each=self._after_range,
        )

    async def _after_range(self) -> None:
        await self._record_upload_id()
        await self._progress(Phase.WRITING)

    async def _write_zip(self) -> ArtifactFiles:
        """Write the ZIP of an export with media (``MediaZip``): plan its attachments from those the selected
        messages carry, then stream it into the attempt's object; return it verified.
        """
        # Imported by the first export with media: the ZIP writer and its cipher library are about 3 MB that an
        # idle worker, and one that never writes media, would otherwise hold (docs/benchmark.md: Memory).
        from services.worker.writing.media_parts import PART_RESERVE
        from services.worker.writing.media_zip import MediaZip

        claimed, settings = self._claimed, self._settings
        request, last = claimed.request, last_seq(claimed)
        cid, after = claimed.conversation_id, request.after_seq
        async with self._pool.acquire() as conn:
            carried = await export_reader.carried_attachments(
                conn, conversation_id=cid, after_seq=after, last_seq=last, request=request
            )
            newest = await export_reader.last_export_row(
                conn,
                operation_id=claimed.operation_id,
                conversation_id=cid,
                after_seq=after,
                last_seq=last,
                request=request,
            )
        # The file's newest message dates the file in the ZIP, so every attempt writes the same bytes.
        modified_at = newest.sent_at if newest is not None else ZIP_EPOCH
        max_file_bytes = request.media_max_file_bytes
        if request.max_part_bytes is not None:
            # A file that fits in no part is too large (docs/api.md: Submitting an export, Exports with media).
            fits = request.max_part_bytes - PART_RESERVE
            max_file_bytes = fits if max_file_bytes is None else min(max_file_bytes, fits)
        plan = plan_media(
            carried,
            types=request.media_types,
            max_file_bytes=max_file_bytes,
            max_total_bytes=request.media_max_total_bytes,
        )
        async with self._pool.acquire() as conn:
            messages_bytes = await export_reader.range_bytes(
                conn, conversation_id=cid, after_seq=after, last_seq=last, recalled=False
            )
            if not await leases.record_estimate(
                conn,
                operation_id=claimed.operation_id,
                generation=claimed.generation,
                estimate_bytes=messages_bytes + plan.included_bytes,
            ):
                raise LeaseLost("estimate")
        if request.max_part_bytes is not None:
            return await self._write_zip_parts(plan, carried, modified_at)
        writer = ObjectWriter.in_bucket(self._s3, settings, key=self.key, content_type=self._kind.content_type)
        self._zip_writers.append(writer)
        zipped = MediaZip(
            s3=self._s3,
            bucket=settings.s3_bucket,
            key=self.key,
            kind=self._kind,
            conversation_id=claimed.conversation_id,
            reader=self._reader,
            writer=writer,
            plan=plan,
            carried=carried,
            modified_at=modified_at,
        )

        async def after_each() -> None:
            if writer.upload_id is not None and writer.upload_id != self._recorded_upload_id:
                await self._record_assembly_upload(writer.upload_id)
            await self._progress(Phase.WRITING, zipped.progress())

        part = await zipped.write(after=after, last=last, after_each=after_each)
        await self._progress(Phase.UPLOADING, zipped.progress())
        return ArtifactFiles(self.key, (part,), split=False)

    async def _write_zip_parts(
        self, plan: MediaPlan, carried: list[export_reader.CarriedAttachment], modified_at: datetime
    ) -> ArtifactFiles:
        """Write a split export with media (``MediaZipParts``): parts of self-contained ZIPs under the attempt's
        folder; return them verified.
        """
        from services.worker.writing.media_parts import MediaZipParts  # as ``_write_zip``'s, on first use

        claimed, settings = self._claimed, self._settings
        request = claimed.request
        assert request.max_part_bytes is not None

        def writer_for(key: str) -> ObjectWriter:
            writer = ObjectWriter.in_bucket(self._s3, settings, key=key, content_type=self._kind.content_type)
            self._zip_writers.append(writer)
            return writer

        zipped = MediaZipParts(
            s3=self._s3,
            bucket=settings.s3_bucket,
            folder=self.key,
            kind=self._kind,
            conversation_id=claimed.conversation_id,
            reader=self._reader,
            writer_for=writer_for,
            plan=plan,
            carried=carried,
            modified_at=modified_at,
            max_part_bytes=request.max_part_bytes,
        )

        async def after_each() -> None:
            await self._progress(Phase.WRITING, zipped.progress())

        parts = await zipped.write(after=request.after_seq, last=last_seq(claimed), after_each=after_each)
        await self._progress(Phase.UPLOADING, zipped.progress())
        return ArtifactFiles(self.key, tuple(parts), split=True)

    async def _complete(self, files: ArtifactFiles) -> None:
        """Record the verified ``files`` in the artifact that holds them (COMPLETE); raises ``LeaseLost``."""
        claimed = self._claimed
        async with self._pool.acquire() as conn:
            if not await artifacts.complete_artifact(
                conn, operation_id=claimed.operation_id, generation=self._artifact_generation, files=files
            ):
                raise LeaseLost("artifact")

    async def _record_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Record an assembly's ``checkpoint`` in the artifact that holds the file, fenced on this attempt's
        lease; raises ``LeaseLost``.
        """
        claimed = self._claimed
        async with self._pool.acquire() as conn:
            if not await artifacts.record_assembly(
                conn,
                operation_id=claimed.operation_id,
                generation=self._artifact_generation,
                holder_generation=claimed.generation,
                checkpoint=checkpoint.as_json(),
            ):
                raise LeaseLost("assembly")

    async def _progress(self, phase: Phase, counts: tuple[int, int] | None = None) -> None:
        """Show ``phase`` and the counts so far (messages, bytes: the files', or ``counts``) in the operation,
        at most every ``PROGRESS_INTERVAL_SECONDS`` from the job's start: a small export then writes no
        progress-only row (docs/api.md: Operations, Operation). The lease does not depend on it (the
        heartbeat keeps it), and every write that ends the attempt is fenced on its own. Raises ``LeaseLost``.
        """
        update_log_fields(phase=phase)
        now = time.monotonic()
        if now - self._progress_written_at < PROGRESS_INTERVAL_SECONDS:
            return
        self._progress_written_at = now
        claimed = self._claimed
        messages, stored_bytes = counts or self._files.progress()
        async with self._pool.acquire() as conn:
            held = await leases.record_progress(
                conn,
                operation_id=claimed.operation_id,
                generation=claimed.generation,
                phase=phase,
                messages_written=messages,
                bytes_written=stored_bytes,
                lease_seconds=self._settings.lease_seconds,
            )
        if not held:
            raise LeaseLost("progress")

    async def _record_assembly_upload(self, upload_id: str) -> None:
        """Record ``upload_id`` in the attempt's artifact: the upload of its files, or of a chunked export's
        assembly before its first part (docs/chunks.md: Chunked exports).
        """
        async with self._pool.acquire() as conn:
            await artifacts.record_upload_id(
                conn, operation_id=self._claimed.operation_id, generation=self._artifact_generation, upload_id=upload_id
            )
        self._recorded_upload_id = upload_id

    async def _record_upload_id(self) -> None:
        """Record the multipart upload the files began last, once, for operators (docs/api.md: Administration,
        Admin view of an operation); clean-up finds uploads by listing their keys, so it does not depend on this.
        """
        upload_id = self._files.upload_id
        if upload_id is not None and upload_id != self._recorded_upload_id:
            await self._record_assembly_upload(upload_id)

    async def discard(self, generation: int) -> None:
        """Stop the upload in flight and remove the objects and uploads of ``generation`` (this attempt's, or
        the earlier one ``write`` returned, and then also this attempt's record, which its claim made); what
        cannot be removed now, the janitor removes later.

        Under the artifact's record: a newer generation may have adopted the object meanwhile, and then it is
        kept (``remove_artifact`` refuses a served result).
        """
        for writer in (*self._files.writers(), *self._zip_writers):
            await writer.abandon()
        for each in dict.fromkeys((generation, self._claimed.generation)):
            try:
                await self._remove(each)
            except Exception:
                log.warning(
                    "could not remove artifact; left to the janitor",
                    extra=self._claimed.log_extra(artifact_generation=each),
                )

    async def _remove(self, generation: int) -> bool:
        """``remove_artifact`` for this operation's ``generation``; raises what it raises."""
        return await remove_artifact(
            self._pool,
            self._s3,
            bucket=self._settings.s3_bucket,
            operation_id=self._claimed.operation_id,
            generation=generation,
        )


def last_seq(claimed: ClaimedOperation) -> int:
    """The highest seq the attempt's file may hold: below the request's ``before_seq`` and within the
    snapshot the first claim fixed (docs/api.md: API reference). The file holds the seqs above the request's
    ``after_seq`` up to this one.
    """
    before_seq = claimed.request.before_seq
    return claimed.snapshot_max_seq if before_seq is None else min(claimed.snapshot_max_seq, before_seq - 1)
