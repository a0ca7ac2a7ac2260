"""Row factories: state written straight into a test's Postgres database, as the parts would have left it,
for tests that arrange what the API cannot (a lease that expired, an attempt's artifact, a due outbox row).
Every helper that inserts rows for a test lives here.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

import asyncpg

# ``Settings.s3_prefix`` as the tests keep it: object keys are ``exports/<operation_id>/g<generation>.jsonl``.
S3_PREFIX = "exports/"


async def insert_operation(pool: asyncpg.Pool, operation_id: str, state: str, **columns: Any) -> None:
    """An ``operations`` row in ``state``: alice's JSONL export of ``c-a`` unless ``columns`` say otherwise;
    ``columns`` sets any other column by name.
    """
    values = {"owner_id": "alice", "conversation_id": "c-a", "format": "jsonl", "state": state, **columns}
    names = ", ".join(["operation_id", *values])
    marks = ", ".join(f"${n}" for n in range(1, len(values) + 2))
    await pool.execute(f"INSERT INTO operations ({names}) VALUES ({marks})", operation_id, *values.values())


async def shift(pool: asyncpg.Pool, operation_id: str, column: str, interval: str) -> None:
    """Set a time column of an operation to the database's now() plus ``interval``."""
    await pool.execute(
        f"UPDATE operations SET {column} = now() + $2::text::interval WHERE operation_id = $1", operation_id, interval
    )


async def insert_artifact(
    pool: asyncpg.Pool,
    operation_id: str,
    generation: int,
    state: str,
    *,
    upload_id: str | None = None,
    updated_at: dt.datetime | None = None,
    data: bytes | None = None,
) -> str:
    """An ``artifacts`` row for the attempt ``generation`` of ``operation_id``; return its object key.

    ``data``, when given, is the file the attempt wrote: its size, sha256 and line count are recorded, as a
    verified upload records them. ``updated_at`` defaults to the database's now().
    """
    key = f"{S3_PREFIX}{operation_id}/g{generation}.jsonl"
    await pool.execute(
        "INSERT INTO artifacts"
        " (operation_id, generation, object_key, state, upload_id, updated_at, size_bytes, sha256, message_count)"
        " VALUES ($1, $2, $3, $4, $5, coalesce($6, now()), $7, $8, $9)",
        operation_id,
        generation,
        key,
        state,
        upload_id,
        updated_at,
        None if data is None else len(data),
        None if data is None else hashlib.sha256(data).hexdigest(),
        None if data is None else data.count(b"\n"),
    )
    return key


async def insert_outbox_row(pool: asyncpg.Pool, not_before: str) -> None:
    """An unpublished wake-up of ``op_1`` due at the database's now() plus ``not_before`` (an interval)."""
    await pool.execute(
        "INSERT INTO outbox (operation_id, routing_key, payload, not_before)"
        " VALUES ('op_1', 'k', '{}', now() + $1::text::interval)",
        not_before,
    )
