"""Removing artifacts: an object and every multipart upload under its key, under its Postgres record.

Used by the worker (its own attempt's leftovers, earlier generations' partial objects, a cancel) and the
janitor (orphans, cancellations, expired results). Removal is in three steps, none holding a transaction
across S3: mark the record REMOVING (refused for a served result), clean S3, mark it DELETED. A removal
that dies between the steps leaves REMOVING, which nobody can publish and the janitor finishes.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg

from shared.repository import artifacts as artifact_records
from shared.repository import chunks
from shared.storage import (
    S3_BATCH_MAX,
    ObjectPages,
    UploadPages,
    abort_upload,
    delete_keys,
    every_entry,
    is_folder,
)

log = logging.getLogger(__name__)


async def remove_artifact(pool: asyncpg.Pool, s3: Any, *, bucket: str, operation_id: str, generation: int) -> bool:
    """Delete the object of (``operation_id``, ``generation``) and abort its uploads; record it DELETED.

    Returns False, touching nothing, when the object is a served result (PUBLISHED and not EXPIRED) or
    was never recorded (nothing was uploaded then); True once it is gone. An already DELETED record is
    cleaned again: a paused holder may have finished an upload after an earlier removal. Raises S3's
    errors (``ClientError``, ``BotoCoreError``) and the database's; the record then stays REMOVING for a
    later pass.
    """
    async with pool.acquire() as conn:
        key = await artifact_records.start_removal(conn, operation_id=operation_id, generation=generation)
    if key is None:
        return False
    await remove_object(s3, bucket=bucket, key=key)
    async with pool.acquire() as conn:
        await artifact_records.finish_removal(conn, operation_id=operation_id, generation=generation)
    return True


async def remove_artifacts(pool: asyncpg.Pool, s3: Any, *, bucket: str, operation_id: str) -> bool:
    """``remove_artifact`` for every generation of ``operation_id`` not yet DELETED, then
    ``remove_chunk_objects``; True if all went.

    Errors are not raised: what could not be removed stays recorded for the janitor's next pass.
    """
    async with pool.acquire() as conn:
        artifacts = await artifact_records.unremoved_artifacts(conn, operation_id=operation_id)
    removed = True
    for artifact in artifacts:
        try:
            gone = await remove_artifact(
                pool, s3, bucket=bucket, operation_id=operation_id, generation=artifact.generation
            )
        except Exception as exc:
            log.warning(
                "could not remove artifact; a later pass retries",
                extra={"operation_id": operation_id, "generation": artifact.generation, "error": type(exc).__name__},
            )
            gone = False
        removed = removed and gone
    return await remove_chunk_objects(pool, s3, bucket=bucket, operation_id=operation_id) and removed


async def remove_chunk_objects(pool: asyncpg.Pool, s3: Any, *, bucket: str, operation_id: str) -> bool:
    """Delete the objects and abort the uploads the chunks of ``operation_id`` name (docs/chunks.md: Chunked
    exports), once the export ended or no longer needs them; True if all went. Errors are not raised: the
    janitor removes what is left once no running or parked export's chunk names it. A chunk's holder that
    is still writing removes its own object when its next fenced write fails.
    """
    async with pool.acquire() as conn:
        keys = await chunks.object_keys(conn, operation_id=operation_id)
    removed = True
    for key in keys:
        try:
            await remove_object(s3, bucket=bucket, key=key)
        except Exception as exc:
            log.warning(
                "could not remove a chunk's object; a later pass retries",
                extra={"operation_id": operation_id, "key": key, "error": type(exc).__name__},
            )
            removed = False
    return removed


async def remove_object(s3: Any, *, bucket: str, key: str) -> None:
    """Abort every multipart upload of ``key`` and delete the object, or, for a split artifact's folder
    (``shared.storage.is_folder``), of every key under it; what is already gone is no error.
    """
    # Listed rather than taken from the record: a worker may die between creating an upload and recording
    # its id, or between recording a split artifact and finishing its last part.
    for upload in await every_entry(UploadPages(s3, bucket=bucket, prefix=key)):
        if upload.key == key or is_folder(key):
            await abort_upload(s3, bucket=bucket, key=upload.key, upload_id=upload.upload_id)
    if not is_folder(key):
        await s3.delete_object(Bucket=bucket, Key=key)
        return
    keys = [listed.key for listed in await every_entry(ObjectPages(s3, bucket=bucket, prefix=key))]
    for start in range(0, len(keys), S3_BATCH_MAX):
        batch = keys[start : start + S3_BATCH_MAX]
        if len(await delete_keys(s3, bucket=bucket, keys=batch)) != len(batch):
            raise RuntimeError(f"could not delete every part under {key}")
