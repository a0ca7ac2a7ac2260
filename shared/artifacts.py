"""Removing an artifact: its object and every multipart upload under its key, under its Postgres record.

Used by the worker (its own attempt's leftovers, an earlier generation's partial object) and the janitor
(orphans, cancellations, expired results). The artifact row stays locked while S3 is cleaned, so a removal
cannot cross an adoption, which publishes an earlier generation's object by moving its record from COMPLETE
to PUBLISHED in the SUCCEEDED transaction (contract 6): whichever locks the row first wins, and the other
sees the outcome. A published object is only ever removed once its operation is EXPIRED.
"""

from __future__ import annotations

import contextlib
from typing import Any

import asyncpg

# The row of one artifact, locked, with whether its object may be removed.
_LOCK_SQL = """
SELECT a.object_key, a.state = 'PUBLISHED' AND o.state <> 'EXPIRED' AS served
FROM artifacts a JOIN operations o USING (operation_id)
WHERE a.operation_id = $1 AND a.generation = $2
FOR UPDATE OF a
"""

_MARK_DELETED_SQL = """
UPDATE artifacts SET state = 'DELETED', updated_at = now() WHERE operation_id = $1 AND generation = $2
"""


async def remove_artifact(pool: asyncpg.Pool, s3: Any, *, bucket: str, operation_id: str, generation: int) -> bool:
    """Delete the object of (``operation_id``, ``generation``) and abort its uploads, then record it DELETED.

    Returns False, touching nothing, when the object is a served result (PUBLISHED and not EXPIRED); True
    when it is gone (also when it was never recorded or already DELETED: S3 is cleaned again anyway, since
    a paused holder may have finished an upload after an earlier removal). Raises S3's errors
    (``botocore.exceptions.ClientError``, ``BotoCoreError``) and the database's; the record then stays as it
    was, so a later pass tries again.
    """
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(_LOCK_SQL, operation_id, generation)
        if row is None:
            return True
        if row["served"]:
            return False
        await remove_object(s3, bucket=bucket, key=row["object_key"])
        await conn.execute(_MARK_DELETED_SQL, operation_id, generation)
    return True


async def remove_object(s3: Any, *, bucket: str, key: str) -> None:
    """Abort every multipart upload of ``key`` and delete the object; what is already gone is no error."""
    # Listed rather than taken from the record: a worker may die between creating an upload and recording
    # its id.
    listing = await s3.list_multipart_uploads(Bucket=bucket, Prefix=key)
    for upload in listing.get("Uploads", []):
        if upload["Key"] == key:
            with contextlib.suppress(s3.exceptions.NoSuchUpload):
                await s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"])
    await s3.delete_object(Bucket=bucket, Key=key)
