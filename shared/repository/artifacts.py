"""The ``artifacts`` table: the record of every object an attempt writes, made before its first byte, and
its life WRITING -> COMPLETE -> PUBLISHED, and -> REMOVING -> DELETED when it must go (README: How it works;
``shared.states.ArtifactState``). Writes of a holder are fenced by the generation, as the operation's are.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from shared.repository.rows import Row


async def record_artifact(conn: asyncpg.Connection, *, operation_id: str, generation: int, object_key: str) -> bool:
    """Record the artifact key before its first byte is uploaded (README: How it works); False without the lease."""
    status = await conn.execute(
        """
        INSERT INTO artifacts (operation_id, generation, object_key, state)
        SELECT $1, $2, $3, 'WRITING' FROM operations
        WHERE operation_id = $1 AND generation = $2 AND state = 'RUNNING'
        """,
        operation_id,
        generation,
        object_key,
    )
    return status == "INSERT 0 1"


async def record_upload_id(conn: asyncpg.Connection, *, operation_id: str, generation: int, upload_id: str) -> None:
    """Remember the multipart upload of an artifact, for operators; clean-up lists uploads by key anyway."""
    await conn.execute(
        "UPDATE artifacts SET upload_id = $3, updated_at = now() WHERE operation_id = $1 AND generation = $2",
        operation_id,
        generation,
        upload_id,
    )


async def complete_artifact(
    conn: asyncpg.Connection, *, operation_id: str, generation: int, size_bytes: int, sha256: str, message_count: int
) -> bool:
    """WRITING -> COMPLETE with the verified figures; False when the record moved on (a newer generation
    removed this attempt's object, so it may never be published or adopted).
    """
    status = await conn.execute(
        """
        UPDATE artifacts SET state = 'COMPLETE', size_bytes = $3, sha256 = $4, message_count = $5, updated_at = now()
        WHERE operation_id = $1 AND generation = $2 AND state = 'WRITING'
        """,
        operation_id,
        generation,
        size_bytes,
        sha256,
        message_count,
    )
    return status == "UPDATE 1"


async def publish_artifact(conn: asyncpg.Connection, *, operation_id: str, generation: int) -> bool:
    """COMPLETE -> PUBLISHED, in the SUCCEEDED transaction; False when the artifact was removed meanwhile.

    The row lock this takes orders it against ``shared.artifacts.remove_artifact``.
    """
    status = await conn.execute(
        """
        UPDATE artifacts SET state = 'PUBLISHED', updated_at = now()
        WHERE operation_id = $1 AND generation = $2 AND state = 'COMPLETE'
        """,
        operation_id,
        generation,
    )
    return status == "UPDATE 1"


async def start_removal(conn: asyncpg.Connection, *, operation_id: str, generation: int) -> str | None:
    """Move an artifact to REMOVING and return its object key; None when it is a served result (PUBLISHED
    and its operation not EXPIRED) or was never recorded.

    Committed before S3 is touched (README: How it works): an adoption needs COMPLETE and the old holder needs
    WRITING, so neither can take the object back while it is deleted. The row lock orders this against an
    adoption's ``COMPLETE -> PUBLISHED``: whichever commits first wins.
    """
    key: str | None = await conn.fetchval(
        """
        UPDATE artifacts a SET state = 'REMOVING', updated_at = now()
        FROM operations o
        WHERE a.operation_id = o.operation_id AND a.operation_id = $1 AND a.generation = $2
          AND NOT (a.state = 'PUBLISHED' AND o.state <> 'EXPIRED')
        RETURNING a.object_key
        """,
        operation_id,
        generation,
    )
    return key


async def finish_removal(conn: asyncpg.Connection, *, operation_id: str, generation: int) -> None:
    """REMOVING -> DELETED once the object and its uploads are gone from S3."""
    await conn.execute(
        """
        UPDATE artifacts SET state = 'DELETED', updated_at = now()
        WHERE operation_id = $1 AND generation = $2 AND state = 'REMOVING'
        """,
        operation_id,
        generation,
    )


@dataclass(frozen=True)
class ArtifactRecord(Row):
    """The record of one generation's object: its key and state, and, once COMPLETE, the verified size
    (bytes), sha256 (hex) and message count (None before).
    """

    generation: int
    object_key: str
    state: str
    size_bytes: int | None
    sha256: str | None
    message_count: int | None


async def unremoved_artifacts(
    conn: asyncpg.Connection, *, operation_id: str, below_generation: int | None = None
) -> list[ArtifactRecord]:
    """Artifacts of ``operation_id`` (only generations below ``below_generation`` when given) that may still
    have an object or upload in S3, newest first.
    """
    rows = await conn.fetch(
        """
        SELECT generation, object_key, state, size_bytes, sha256, message_count FROM artifacts
        WHERE operation_id = $1 AND state <> 'DELETED' AND ($2::bigint IS NULL OR generation < $2)
        ORDER BY generation DESC
        """,
        operation_id,
        below_generation,
    )
    return [ArtifactRecord.from_row(row) for row in rows]


@dataclass(frozen=True)
class StaleArtifact(Row):
    """An artifact whose object must go; ``left_behind`` when it was never publishable: an attempt ended
    (crashed, superseded, failed) without either publishing it or finishing its removal, so the outcome it
    left is unknown. Otherwise it is an EXPIRED result whose deletion failed when it expired.
    """

    operation_id: str
    generation: int
    object_key: str
    state: str
    left_behind: bool


async def stale_artifacts(conn: asyncpg.Connection, *, grace_seconds: float, limit: int) -> list[StaleArtifact]:
    """Artifacts whose object must go, untouched for ``grace_seconds``: never publishable (a newer
    generation holds their operation, or it ended without them), or an EXPIRED result whose deletion
    failed when it expired.
    """
    rows = await conn.fetch(
        """
        SELECT operation_id, generation, object_key, state, left_behind FROM (
            SELECT a.operation_id, a.generation, a.object_key, a.state, a.updated_at,
                   o.state = 'EXPIRED' AS expired_result,
                   (a.state <> 'PUBLISHED'
                    AND (a.generation < o.generation
                         OR o.state IN ('SUCCEEDED', 'CANCELED', 'FAILED', 'FAILED_REPAIR'))) AS left_behind
            FROM artifacts a JOIN operations o USING (operation_id)
            WHERE a.state <> 'DELETED' AND a.updated_at < now() - make_interval(secs => $1)) candidates
        WHERE expired_result OR left_behind
        ORDER BY updated_at LIMIT $2
        """,
        grace_seconds,
        limit,
    )
    return [StaleArtifact.from_row(row) for row in rows]


@dataclass(frozen=True)
class LiveArtifact(Row):
    """An artifact's state (not DELETED) and the multipart upload it recorded, if any."""

    state: str
    upload_id: str | None


async def live_artifacts(conn: asyncpg.Connection, *, object_keys: list[str]) -> dict[str, LiveArtifact]:
    """The artifact records among ``object_keys`` that may still be written, published or served, or are
    being removed (any state but DELETED), by object key. A key missing from the
    result has no record, or a DELETED one, and can never get a live one: a record is made before its
    key's first byte (README: How it works) and never leaves DELETED.
    """
    rows = await conn.fetch(
        """
        SELECT object_key, state, upload_id FROM artifacts
        WHERE object_key = ANY($1::text[]) AND state <> 'DELETED'
        """,
        object_keys,
    )
    return {row["object_key"]: LiveArtifact.from_row(row) for row in rows}


async def list_artifacts(conn: asyncpg.Connection, *, operation_id: str) -> list[asyncpg.Record]:
    """Every artifact recorded for the operation, oldest generation first: (generation, object_key, state,
    upload_id, size_bytes, sha256, message_count, created_at, updated_at).
    """
    rows: list[asyncpg.Record] = await conn.fetch(
        """
        SELECT generation, object_key, state, upload_id, size_bytes, sha256, message_count, created_at, updated_at
        FROM artifacts WHERE operation_id = $1 ORDER BY generation
        """,
        operation_id,
    )
    return rows
