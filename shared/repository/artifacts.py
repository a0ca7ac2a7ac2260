"""The ``artifacts`` table: the record of every object an attempt writes, made before its first byte, and
its life WRITING -> COMPLETE -> PUBLISHED, and -> REMOVING -> DELETED when it must go (docs/architecture.md: How it
works; ``shared.states.ArtifactState``). Writes of a holder are fenced by the generation, as the operation's are.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import asyncpg

from shared.repository.rows import Row
from shared.states import ENDED, values


@dataclass(frozen=True)
class StoredPart:
    """One finished, verified file of an artifact (its one file, or one of its parts): its 1-based ``number``,
    S3 ``key``, stored ``size_bytes`` and hex ``sha256`` (of the stored, possibly compressed, bytes), the
    messages it holds and their first and last seq (None when it holds none). The worker's files return it
    (``services.worker.writing.files``), the ``parts`` column holds its fields, and so does a result's ``parts``.
    """

    number: int
    key: str
    size_bytes: int
    sha256: str
    message_count: int
    first_seq: int | None
    last_seq: int | None


@dataclass(frozen=True)
class ArtifactFiles:
    """What one generation wrote: one file under ``key``, or (``split``) parts under the folder ``key``
    (docs/api.md: Submitting an export, Export options).
    """

    key: str
    parts: tuple[StoredPart, ...]
    split: bool

    @property
    def message_count(self) -> int:
        """The messages of every part."""
        return sum(part.message_count for part in self.parts)

    @property
    def size_bytes(self) -> int:
        """The stored bytes of every part."""
        return sum(part.size_bytes for part in self.parts)

    @property
    def single(self) -> StoredPart | None:
        """The one file of an artifact that is not split."""
        return None if self.split else self.parts[0]

    def parts_json(self) -> str | None:
        """The parts as ``artifacts.parts`` and ``operations.result_parts`` hold them; None when not split."""
        return json.dumps([asdict(part) for part in self.parts]) if self.split else None

    @classmethod
    def from_record(
        cls, *, key: str, size_bytes: int, sha256: str | None, message_count: int, parts: str | None
    ) -> ArtifactFiles:
        """Rebuild from a COMPLETE record: ``parts`` is the JSON text of ``parts_json`` or None for one file."""
        if parts is not None:
            return cls(key, tuple(StoredPart(**part) for part in json.loads(parts)), split=True)
        assert sha256 is not None
        return cls.one_file(key, size_bytes=size_bytes, sha256=sha256, message_count=message_count)

    @classmethod
    def one_file(cls, key: str, *, size_bytes: int, sha256: str, message_count: int) -> ArtifactFiles:
        """An artifact that is one object: ``key`` holding ``size_bytes`` bytes with hex ``sha256``."""
        return cls(key, (StoredPart(1, key, size_bytes, sha256, message_count, None, None),), split=False)


async def record_upload_id(conn: asyncpg.Connection, *, operation_id: str, generation: int, upload_id: str) -> None:
    """Remember the multipart upload of an artifact, for operators; clean-up lists uploads by key anyway."""
    await conn.execute(
        "UPDATE artifacts SET upload_id = $3, updated_at = now() WHERE operation_id = $1 AND generation = $2",
        operation_id,
        generation,
        upload_id,
    )


async def record_assembly(
    conn: asyncpg.Connection, *, operation_id: str, generation: int, holder_generation: int, checkpoint: str
) -> bool:
    """Record an assembly's ``checkpoint`` (JSON, ``services.worker.chunked.assembly.Checkpoint``) and its
    upload in the WRITING artifact of ``generation``, for the lease holder of ``holder_generation``, which is
    that generation or a later one that resumed it (docs/chunks.md: Chunked exports, A coordinator's takeover);
    False when the lease or the record moved on.
    """
    status = await conn.execute(
        """
        UPDATE artifacts a SET assembly = $4::jsonb, upload_id = $4::jsonb ->> 'upload_id', updated_at = now()
        FROM operations o
        WHERE a.operation_id = $1 AND a.generation = $2 AND a.state = 'WRITING'
          AND o.operation_id = $1 AND o.generation = $3 AND o.state = 'RUNNING'
        """,
        operation_id,
        generation,
        holder_generation,
        checkpoint,
    )
    return status == "UPDATE 1"


async def complete_artifact(
    conn: asyncpg.Connection, *, operation_id: str, generation: int, files: ArtifactFiles
) -> bool:
    """WRITING -> COMPLETE with the verified figures (a split artifact: the sum of its parts' sizes, no sha256
    of its own, and its parts); False when the record moved on (a newer generation removed this attempt's
    object, so it may never be published or adopted).
    """
    single = files.single
    status = await conn.execute(
        """
        UPDATE artifacts SET state = 'COMPLETE', size_bytes = $3, sha256 = $4, message_count = $5,
            parts = $6::jsonb, updated_at = now()
        WHERE operation_id = $1 AND generation = $2 AND state = 'WRITING'
        """,
        operation_id,
        generation,
        files.size_bytes,
        None if single is None else single.sha256,
        files.message_count,
        files.parts_json(),
    )
    return status == "UPDATE 1"


async def start_removal(conn: asyncpg.Connection, *, operation_id: str, generation: int) -> str | None:
    """Move an artifact to REMOVING and return its object key; None when it is a served result (PUBLISHED
    and its operation not EXPIRED) or was never recorded.

    Committed before S3 is touched (docs/architecture.md: How it works): an adoption needs COMPLETE and the old holder
    needs WRITING, so neither can take the object back while it is deleted. The row lock orders this against an
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
    """The record of one generation's object: its key and state, once COMPLETE the verified size (bytes), sha256
    (hex) and message count (None before), and an assembly's last checkpoint (JSON text, ``record_assembly``).
    """

    generation: int
    object_key: str
    state: str
    size_bytes: int | None
    sha256: str | None
    message_count: int | None
    parts: str | None
    assembly: str | None

    def files(self) -> ArtifactFiles:
        """The verified files of a COMPLETE (or PUBLISHED) record."""
        assert self.size_bytes is not None and self.message_count is not None
        return ArtifactFiles.from_record(
            key=self.object_key,
            size_bytes=self.size_bytes,
            sha256=self.sha256,
            message_count=self.message_count,
            parts=self.parts,
        )


async def unremoved_artifacts(
    conn: asyncpg.Connection, *, operation_id: str, below_generation: int | None = None
) -> list[ArtifactRecord]:
    """Artifacts of ``operation_id`` (only generations below ``below_generation`` when given) that may still
    have an object or upload in S3, newest first.
    """
    rows = await conn.fetch(
        """
        SELECT generation, object_key, state, size_bytes, sha256, message_count, parts::text, assembly::text
        FROM artifacts
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
                         OR o.state = ANY($3::text[]))) AS left_behind
            FROM artifacts a JOIN operations o USING (operation_id)
            WHERE a.state <> 'DELETED' AND a.updated_at < now() - make_interval(secs => $1)) candidates
        WHERE expired_result OR left_behind
        ORDER BY updated_at LIMIT $2
        """,
        grace_seconds,
        limit,
        values(ENDED),
    )
    return [StaleArtifact.from_row(row) for row in rows]


@dataclass(frozen=True)
class LiveArtifact(Row):
    """An artifact's state (not DELETED) and the multipart upload it recorded, if any."""

    state: str
    upload_id: str | None


async def live_artifacts(conn: asyncpg.Connection, *, object_keys: list[str]) -> dict[str, LiveArtifact]:
    """The live records (any state but DELETED: still written, published or served, or being removed) that
    name ``object_keys``, by object key: a record names its own key, and a split artifact's record (its key a
    folder) every key under it. A key missing from the result has no record, or a DELETED one, and can
    never get a live one: a record is made before its key's first byte (docs/architecture.md: How it works) and never
    leaves DELETED.
    """
    rows = await conn.fetch(
        """
        SELECT k.key, a.state, a.upload_id FROM unnest($1::text[]) AS k(key)
        JOIN artifacts a ON a.object_key IN (k.key, regexp_replace(k.key, '[^/]*$', ''))
        WHERE a.state <> 'DELETED'
        """,
        object_keys,
    )
    return {row["key"]: LiveArtifact.from_row(row) for row in rows}


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
