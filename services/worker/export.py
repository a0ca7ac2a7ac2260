"""One export attempt under a lease: read the messages in seq ranges, stream them into S3, verify, and commit SUCCEEDED
together with the membership re-check (README: API reference, The file; States and failure model; How it works).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from botocore.exceptions import ClientError

from services.worker import metrics
from services.worker.errors import LeaseLost, PermanentError, access_revoked
from services.worker.files import FileSet, ObjectFile, WrittenFile
from services.worker.object_writer import ObjectWriter, read_digest
from shared.artifact_removal import remove_artifact
from shared.logs import update_log_fields
from shared.phases import Phase
from shared.repository import artifacts, conversations, operations
from shared.repository.artifacts import ArtifactFiles, ArtifactRecord, StoredPart
from shared.repository.operations import ClaimedOperation
from shared.settings import Settings
from shared.states import ArtifactState
from shared.storage import artifact_key, part_key

log = logging.getLogger(__name__)

# Seqs in the first range an attempt reads, before it knows how many bytes a seq takes.
FIRST_RANGE_SEQS = 1000
# The least time between two progress writes of an attempt after its first (README: API reference, Operation).
PROGRESS_INTERVAL_SECONDS = 1.0


class ExportJob:
    """Runs one attempt for ``claimed``; raises ``LeaseLost``, ``PermanentError`` or a transient error."""

    def __init__(self, *, pool: asyncpg.Pool, s3: Any, settings: Settings, claimed: ClaimedOperation) -> None:
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
        # Postgres writes JSONL lines straight through COPY; other formats, and parts (which need each
        # message's seq and size), render message by message.
        self._by_row = not self._kind.postgres_renders or self._split
        # Once the SUCCEEDED commit was sent its outcome may be unknown (a lost connection): from then on
        # the object must not be deleted here; the janitor removes it if it was not published.
        self._commit_sent = False
        self._files = FileSet(self._open_file, max_part_bytes=request.max_part_bytes)
        self._progress_written_at: float | None = None

    def _open_file(self, number: int) -> ObjectFile:
        key = part_key(self.key, number, extension=self._kind.extension) if self._split else self.key
        writer = ObjectWriter(
            self._s3,
            bucket=self._settings.s3_bucket,
            key=key,
            part_size=self._settings.s3_part_size_bytes,
            timeout_seconds=self._settings.s3_timeout_seconds,
            content_type=self._kind.content_type,
            on_upload_started=self._record_upload_id,
        )
        shape = self._kind.renderer(self._claimed.conversation_id)
        return ObjectFile(writer, shape, key=key, number=number, compressed=self._kind.compressed)

    async def run(self) -> None:
        """Adopt an earlier generation's verified file, or write, verify and publish a new one; on any
        failure remove what this attempt uploaded.
        """
        if await self._settle_earlier_generations():
            return
        claimed = self._claimed
        async with self._pool.acquire() as conn:
            if not await artifacts.record_artifact(
                conn, operation_id=claimed.operation_id, generation=claimed.generation, object_key=self.key
            ):
                raise LeaseLost("artifact")
        try:
            await self._write_messages()
            files = await self._finish_and_verify()
            await self._publish(files, generation=claimed.generation)
        except (LeaseLost, PermanentError):
            await asyncio.shield(self._discard())
            raise
        except BaseException:
            if not self._commit_sent:
                await asyncio.shield(self._discard())
            raise

    async def _settle_earlier_generations(self) -> bool:
        """After a takeover, publish an earlier generation's complete object if S3 still holds exactly what
        was verified (True), and remove every other earlier object and upload (README: How it works: unknown outcomes).
        """
        claimed = self._claimed
        async with self._pool.acquire() as conn:
            earlier = await artifacts.unremoved_artifacts(
                conn, operation_id=claimed.operation_id, below_generation=claimed.generation
            )
        for artifact in earlier:
            if artifact.state == ArtifactState.COMPLETE and await self._adopt(artifact):
                metrics.ARTIFACTS_ADOPTED.inc()
                return True
            removed = await self._remove(artifact.generation)
            if removed:
                metrics.EARLIER_ARTIFACTS_REMOVED.inc()
            log.info(
                "earlier generation's artifact removed" if removed else "earlier generation's artifact kept",
                extra=claimed.log_extra(artifact_generation=artifact.generation, artifact_state=artifact.state),
            )
        return False

    async def _adopt(self, artifact: ArtifactRecord) -> bool:
        recorded = artifact.files()
        for part in recorded.parts:
            try:
                stored = await read_digest(self._s3, bucket=self._settings.s3_bucket, key=part.key)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
                    raise
                return False
            # The same size and sha256 are the same bytes, so every count made of them still holds.
            if (stored.size_bytes, stored.sha256) != (part.size_bytes, part.sha256):
                return False
        try:
            await self._publish(recorded, generation=artifact.generation)
        except ArtifactGone:
            return False
        except (LeaseLost, PermanentError):
            # Canceled, superseded or refused: the object must not outlive the attempt that found it (a
            # newer generation's adoption is safe: a published object is never removed). A failed removal
            # is left to the janitor and must not hide why the attempt ended.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._remove(artifact.generation))
            raise
        log.info("earlier generation's artifact adopted", extra=self._claimed.log_extra(adopted=artifact.generation))
        return True

    async def _write_messages(self) -> None:
        """Read the messages range by range and hand each range to the files once its statement has ended,
        reading the next range while the files take the current one.

        A range is collected in memory rather than streamed from COPY into the writer: waiting for a slow
        S3 inside the statement would hold its snapshot open and run into the statement timeout. To keep
        that memory near one part per range whatever the messages' size, each range is sized from the bytes
        per seq of the one before (at most ``export_batch_rows`` seqs, the first one ``FIRST_RANGE_SEQS``).
        """
        claimed = self._claimed
        if claimed.after_seq >= claimed.last_seq:
            return
        reading: asyncio.Task[Range] | None = asyncio.create_task(self._read_range(claimed.after_seq, FIRST_RANGE_SEQS))
        try:
            while reading is not None:
                current = await reading
                reading = None
                if current.high < claimed.last_seq:
                    span = self._next_span(seqs=current.high - current.low, size=current.size)
                    reading = asyncio.create_task(self._read_range(current.high, span))
                handed = self._files.progress()[1]
                await self._take(current)
                metrics.EXPORTED_BYTES.inc(self._files.progress()[1] - handed)
                await self._progress(Phase.WRITING)
        finally:
            if reading is not None:
                reading.cancel()
                with contextlib.suppress(BaseException):
                    await reading

    async def _take(self, current: Range) -> None:
        if current.rows is not None:
            await self._files.add_rows(current.rows)
        for chunk in current.lines:
            await self._files.add_lines(chunk)

    async def _read_range(self, low: int, span: int) -> Range:
        """The selected messages of seqs ``low < seq <= low + span`` (within the lease's range).

        With options that leave messages out, the range's ``size`` is that of all its messages, not of those
        selected: sizing the next range from what a filter kept (nothing, in a range older than ``since``)
        would make it hold every message of ``export_batch_rows`` seqs at once.
        """
        claimed = self._claimed
        high = min(low + min(span, self._settings.export_batch_rows), claimed.last_seq)
        cid, request = claimed.conversation_id, claimed.request
        async with self._pool.acquire() as conn:
            if self._by_row:
                rows = await conversations.fetch_export_rows(
                    conn, conversation_id=cid, after_seq=low, last_seq=high, request=request
                )
                selected = sum(len(row.line) for row in rows)
                lines: list[bytes] = []
            else:
                rows, lines = None, []
                await conversations.copy_export_lines(
                    conn, conversation_id=cid, after_seq=low, last_seq=high, request=request, output=_appender(lines)
                )
                selected = sum(map(len, lines))
            size = (
                await conversations.range_bytes(conn, conversation_id=cid, after_seq=low, last_seq=high)
                if request.selects_messages
                else selected
            )
        return Range(low, high, size, lines=lines, rows=rows)

    def _next_span(self, *, seqs: int, size: int) -> int:
        """Seqs for about one part of lines, judged from the last range's ``size`` bytes over ``seqs`` seqs."""
        bytes_per_seq = max(size / seqs, 1.0)
        return max(1, int(self._settings.s3_part_size_bytes / bytes_per_seq))

    async def _finish_and_verify(self) -> ArtifactFiles:
        await self._progress(Phase.UPLOADING)
        # SUCCEEDED promises verified files (README: States and failure model): each writer checks what S3
        # stored against what it sent (``ObjectWriter.finish``).
        written = await self._files.finish()
        files = ArtifactFiles(self.key, tuple(_stored_part(done) for done in written), split=self._split)
        claimed = self._claimed
        async with self._pool.acquire() as conn:
            if not await artifacts.complete_artifact(
                conn, operation_id=claimed.operation_id, generation=claimed.generation, files=files
            ):
                raise LeaseLost("artifact")
        return files

    async def _publish(self, files: ArtifactFiles, *, generation: int) -> None:
        """Commit SUCCEEDED with the ``files`` of ``generation`` (ours, or an adopted earlier one) after the
        membership re-check, in one transaction (README: States and failure model). Raises ``PermanentError`` (access
        revoked), ``LeaseLost``, or ``ArtifactGone`` when that object was removed meanwhile.
        """
        claimed = self._claimed
        async with self._pool.acquire() as conn, conn.transaction():
            if not await conversations.is_member(
                conn, conversation_id=claimed.conversation_id, user_id=claimed.owner_id, lock=True
            ):
                raise access_revoked()
            published = await operations.succeed(
                conn,
                operation_id=claimed.operation_id,
                generation=claimed.generation,
                files=files,
                result_ttl_seconds=self._settings.result_ttl_seconds,
            )
            if not published:
                raise LeaseLost("result")
            if not await artifacts.publish_artifact(conn, operation_id=claimed.operation_id, generation=generation):
                raise ArtifactGone(files.key)
            self._commit_sent = True
        log.info(
            "export succeeded",
            extra=claimed.log_extra(
                size_bytes=files.size_bytes,
                messages=files.message_count,
                parts=len(files.parts),
                key_generation=generation,
            ),
        )

    async def _progress(self, phase: Phase) -> None:
        """Show ``phase`` and the counts so far in the operation, at most every ``PROGRESS_INTERVAL_SECONDS``
        after the first ``writing``: a small export then writes its progress once, not three times. The
        lease does not depend on it (the heartbeat keeps it), and every write that ends the attempt is
        fenced on its own.
        """
        update_log_fields(phase=phase)
        now = time.monotonic()
        if self._progress_written_at is not None and now - self._progress_written_at < PROGRESS_INTERVAL_SECONDS:
            return
        self._progress_written_at = now
        claimed = self._claimed
        messages, stored_bytes = self._files.progress()
        async with self._pool.acquire() as conn:
            held = await operations.record_progress(
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

    async def _record_upload_id(self, upload_id: str) -> None:
        async with self._pool.acquire() as conn:
            await artifacts.record_upload_id(
                conn,
                operation_id=self._claimed.operation_id,
                generation=self._claimed.generation,
                upload_id=upload_id,
            )

    async def _discard(self) -> None:
        """Remove this attempt's object and upload; what cannot be removed now, the janitor removes later.

        Under the artifact's record: a newer generation may have adopted this object meanwhile, and then it
        is kept (``remove_artifact`` refuses a served result).
        """
        for writer in self._files.writers():
            await writer.abandon()
        try:
            await self._remove(self._claimed.generation)
        except Exception:
            log.warning("could not remove artifact; left to the janitor", extra=self._claimed.log_extra(key=self.key))

    async def _remove(self, generation: int) -> bool:
        """``remove_artifact`` for this operation's ``generation``; raises what it raises."""
        return await remove_artifact(
            self._pool,
            self._s3,
            bucket=self._settings.s3_bucket,
            operation_id=self._claimed.operation_id,
            generation=generation,
        )


@dataclass(frozen=True)
class Range:
    """The selected messages of seqs ``low < seq <= high``: as JSONL ``lines`` read by COPY (chunks of
    whole lines), or as ``rows``; ``size`` (bytes) sizes the next range (``ExportJob._read_range``).
    """

    low: int
    high: int
    size: int
    lines: list[bytes] = field(default_factory=list)
    rows: list[conversations.ExportRow] | None = None


def _stored_part(done: WrittenFile) -> StoredPart:
    return StoredPart(
        number=done.number,
        key=done.key,
        size_bytes=done.written.size_bytes,
        sha256=done.written.sha256,
        message_count=done.message_count,
        first_seq=done.first_seq,
        last_seq=done.last_seq,
    )


def _appender(chunks: list[bytes]) -> Callable[[bytes], Awaitable[None]]:
    """A COPY sink that appends each chunk to ``chunks``."""

    async def append(data: bytes) -> None:
        chunks.append(data)

    return append


class ArtifactGone(Exception):
    """The object to publish was removed before the SUCCEEDED transaction could take it (adoption lost a
    race with a removal); the transaction is rolled back.
    """
