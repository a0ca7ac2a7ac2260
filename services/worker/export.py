"""One export attempt under a lease: read the messages in seq ranges, stream them into S3, verify, and commit SUCCEEDED
together with the membership re-check (README: API reference, The file; States and failure model; How it works).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from botocore.exceptions import ClientError

from services.worker import metrics
from services.worker.artifact import ArtifactWriter, Digest, read_digest
from services.worker.errors import LeaseLost, PermanentError, access_revoked
from shared.artifacts import remove_artifact
from shared.logs import update_log_fields
from shared.repository import artifacts, conversations, operations
from shared.repository.operations import ClaimedOperation
from shared.settings import Settings
from shared.states import ArtifactState
from shared.storage import artifact_key

log = logging.getLogger(__name__)

# Seqs in the first range an attempt reads, before it knows how many bytes a seq takes.
FIRST_RANGE_SEQS = 1000


class ExportJob:
    """Runs one attempt for ``claimed``; raises ``LeaseLost``, ``PermanentError`` or a transient error."""

    def __init__(self, *, pool: asyncpg.Pool, s3: Any, settings: Settings, claimed: ClaimedOperation) -> None:
        self._pool = pool
        self._s3 = s3
        self._settings = settings
        self._claimed = claimed
        self.key = artifact_key(settings, claimed.operation_id, claimed.generation)
        # Once the SUCCEEDED commit was sent its outcome may be unknown (a lost connection): from then on
        # the object must not be deleted here; the janitor removes it if it was not published.
        self._commit_sent = False
        self._writer = ArtifactWriter(
            s3,
            bucket=settings.s3_bucket,
            key=self.key,
            part_size=settings.s3_part_size_bytes,
            timeout_seconds=settings.s3_timeout_seconds,
            on_upload_started=self._record_upload_id,
        )

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
            digest = await self._finish_and_verify()
            await self._publish(digest, generation=claimed.generation, key=self.key)
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

    async def _adopt(self, artifact: asyncpg.Record) -> bool:
        recorded = Digest(artifact.size_bytes, artifact.sha256, artifact.message_count)
        try:
            stored = await read_digest(self._s3, bucket=self._settings.s3_bucket, key=artifact.object_key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
                raise
            return False
        if stored != recorded:
            return False
        try:
            await self._publish(recorded, generation=artifact.generation, key=artifact.object_key)
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
        """Read the lines range by range and hand each range to the writer once its statement has ended,
        reading the next range while the writer takes the current one.

        A range is collected in memory rather than streamed from COPY into the writer: waiting for a slow
        S3 inside the statement would hold its snapshot open and run into the statement timeout. To keep
        that memory near one part per range whatever the messages' size, each range is sized from the bytes
        per seq of the one before (at most ``export_batch_rows`` seqs, the first one ``FIRST_RANGE_SEQS``).
        """
        claimed = self._claimed
        if claimed.after_seq >= claimed.last_seq:
            return
        reading: asyncio.Task[tuple[int, int, list[bytes]]] | None = asyncio.create_task(
            self._read_range(claimed.after_seq, FIRST_RANGE_SEQS)
        )
        try:
            while reading is not None:
                low, high, lines = await reading
                reading = None
                size = sum(map(len, lines))
                if high < claimed.last_seq:
                    span = self._next_span(seqs=high - low, size=size)
                    reading = asyncio.create_task(self._read_range(high, span))
                for chunk in lines:
                    await self._writer.write(chunk)
                metrics.EXPORTED_BYTES.inc(size)
                await self._progress("writing")
        finally:
            if reading is not None:
                reading.cancel()
                with contextlib.suppress(BaseException):
                    await reading

    async def _read_range(self, low: int, span: int) -> tuple[int, int, list[bytes]]:
        """The export lines of seqs ``low < seq <= low + span`` (within the lease's range): (low, high, lines)."""
        claimed = self._claimed
        high = min(low + min(span, self._settings.export_batch_rows), claimed.last_seq)
        lines: list[bytes] = []
        async with self._pool.acquire() as conn:
            await conversations.copy_export_lines(
                conn, conversation_id=claimed.conversation_id, after_seq=low, last_seq=high, output=_appender(lines)
            )
        return low, high, lines

    def _next_span(self, *, seqs: int, size: int) -> int:
        """Seqs for about one part of lines, judged from the last range's ``size`` bytes over ``seqs`` seqs."""
        bytes_per_seq = max(size / seqs, 1.0)
        return max(1, int(self._settings.s3_part_size_bytes / bytes_per_seq))

    async def _finish_and_verify(self) -> Digest:
        await self._progress("uploading")
        written = await self._writer.finish()
        # SUCCEEDED promises a verified file (README: States and failure model): measure what S3 actually holds.
        await self._progress("verifying")
        stored = await read_digest(self._s3, bucket=self._settings.s3_bucket, key=self.key)
        if stored != written:
            raise RuntimeError(f"stored object differs from what was written: {stored} != {written}")
        claimed = self._claimed
        async with self._pool.acquire() as conn:
            if not await artifacts.complete_artifact(
                conn,
                operation_id=claimed.operation_id,
                generation=claimed.generation,
                size_bytes=written.size_bytes,
                sha256=written.sha256,
                message_count=written.line_count,
            ):
                raise LeaseLost("artifact")
        return written

    async def _publish(self, digest: Digest, *, generation: int, key: str) -> None:
        """Commit SUCCEEDED with the object ``key`` of ``generation`` (ours, or an adopted earlier one) after the
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
                object_key=key,
                size_bytes=digest.size_bytes,
                sha256=digest.sha256,
                message_count=digest.line_count,
                result_ttl_seconds=self._settings.result_ttl_seconds,
            )
            if not published:
                raise LeaseLost("result")
            if not await artifacts.publish_artifact(conn, operation_id=claimed.operation_id, generation=generation):
                raise ArtifactGone(key)
            self._commit_sent = True
        log.info(
            "export succeeded",
            extra=claimed.log_extra(
                size_bytes=digest.size_bytes, messages=digest.line_count, key_generation=generation
            ),
        )

    async def _progress(self, phase: str) -> None:
        update_log_fields(phase=phase)
        claimed, digest = self._claimed, self._writer.digest()
        async with self._pool.acquire() as conn:
            held = await operations.record_progress(
                conn,
                operation_id=claimed.operation_id,
                generation=claimed.generation,
                phase=phase,
                messages_written=digest.line_count,
                bytes_written=digest.size_bytes,
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
        await self._writer.abandon()
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


def _appender(chunks: list[bytes]) -> Callable[[bytes], Awaitable[None]]:
    """A COPY sink that appends each chunk to ``chunks``."""

    async def append(data: bytes) -> None:
        chunks.append(data)

    return append


class ArtifactGone(Exception):
    """The object to publish was removed before the SUCCEEDED transaction could take it (adoption lost a
    race with a removal); the transaction is rolled back.
    """
