"""The ``attachments`` table: files members upload into a conversation, then send in messages (docs/api.md:
Message store, Attachments). Which messages carry which attachment (``message_attachments``) is the message
store's; this module writes an attachment's own row, from its upload to its removal.

An upload's row is written UPLOADING before the first byte goes to the bucket and becomes STORED, with the
file's size, sha256 and CRC-32, once the object is complete: every object under the attachment prefix has a
row, or is an orphan the janitor may delete (docs/retention.md: Orphan objects and uploads).
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from shared.repository.rows import Row


async def begin_upload(
    conn: asyncpg.Connection,
    *,
    attachment_id: str,
    conversation_id: str,
    uploader_id: str,
    file_name: str,
    content_type: str,
    object_key: str,
) -> None:
    """Record an upload about to start, UPLOADING, before any byte of it is stored."""
    await conn.execute(
        """
        INSERT INTO attachments (attachment_id, conversation_id, uploader_id, file_name, content_type, object_key,
                                 state)
        VALUES ($1, $2, $3, $4, $5, $6, 'UPLOADING')
        """,
        attachment_id,
        conversation_id,
        uploader_id,
        file_name,
        content_type,
        object_key,
    )


async def finish_upload(
    conn: asyncpg.Connection, *, attachment_id: str, size_bytes: int, sha256: str, crc32: int
) -> bool:
    """UPLOADING -> STORED with the stored file's ``size_bytes``, ``sha256`` (hex) and ``crc32`` (the ZIP
    CRC-32, an unsigned 32-bit integer); False when the row is no longer UPLOADING (the janitor removed an
    upload that outlived its grace period), and the object must then go.
    """
    status = await conn.execute(
        """
        UPDATE attachments SET state = 'STORED', size_bytes = $2, sha256 = $3, crc32 = $4
        WHERE attachment_id = $1 AND state = 'UPLOADING'
        """,
        attachment_id,
        size_bytes,
        sha256,
        crc32,
    )
    return status == "UPDATE 1"


async def forget_upload(conn: asyncpg.Connection, *, attachment_id: str) -> None:
    """Delete the row of an upload that did not finish, once its object and multipart upload are gone."""
    await conn.execute("DELETE FROM attachments WHERE attachment_id = $1 AND state = 'UPLOADING'", attachment_id)


@dataclass(frozen=True)
class Attachment(Row):
    """A stored attachment as a member sees it."""

    attachment_id: str
    conversation_id: str
    file_name: str
    content_type: str
    size_bytes: int
    sha256: str
    object_key: str


async def served_attachment(
    conn: asyncpg.Connection, *, conversation_id: str, attachment_id: str, user_id: str
) -> Attachment | None:
    """The STORED attachment ``attachment_id`` of ``conversation_id`` when it may be served to ``user_id``, a
    member (docs/api.md: Message store, Attachments): a message not recalled carries it, or no message does and
    ``user_id`` uploaded it. None otherwise: in particular once every message that carried it is recalled.
    """
    row = await conn.fetchrow(
        """
        SELECT a.attachment_id, a.conversation_id, a.file_name, a.content_type, a.size_bytes, a.sha256, a.object_key
        FROM attachments a
        WHERE a.attachment_id = $1 AND a.conversation_id = $2 AND a.state = 'STORED'
          AND CASE WHEN EXISTS (SELECT 1 FROM message_attachments c WHERE c.attachment_id = a.attachment_id)
                   THEN EXISTS (SELECT 1 FROM message_attachments c
                                JOIN messages m ON m.conversation_id = c.conversation_id AND m.seq = c.seq
                                WHERE c.attachment_id = a.attachment_id AND m.recalled_at IS NULL)
                   ELSE a.uploader_id = $3 END
        """,
        attachment_id,
        conversation_id,
        user_id,
    )
    return None if row is None else Attachment.from_row(row)


@dataclass(frozen=True)
class UnfinishedUpload(Row):
    """An upload the janitor gave up on: its object key."""

    attachment_id: str
    object_key: str


async def take_unfinished_uploads(
    conn: asyncpg.Connection, *, grace_seconds: float, limit: int
) -> list[UnfinishedUpload]:
    """Delete the rows of up to ``limit`` uploads still UPLOADING ``grace_seconds`` after they began (on the
    database's clock: their api stopped or lost the bucket midway) and return them, for the caller to remove
    their objects. The row goes first: an upload that finishes meanwhile finds no row to mark STORED and removes
    its object itself, and an object left behind has no row, which the orphan sweep removes.
    """
    rows = await conn.fetch(
        """
        DELETE FROM attachments WHERE attachment_id IN (
            SELECT attachment_id FROM attachments
            WHERE state = 'UPLOADING' AND created_at < now() - make_interval(secs => $1)
            ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)
          AND state = 'UPLOADING'
        RETURNING attachment_id, object_key
        """,
        grace_seconds,
        limit,
    )
    return [UnfinishedUpload.from_row(row) for row in rows]


async def recorded_keys(conn: asyncpg.Connection, *, keys: list[str]) -> set[str]:
    """The ``keys`` that an attachment row names, in any state."""
    rows = await conn.fetch("SELECT object_key FROM attachments WHERE object_key = ANY($1::text[])", keys)
    return {row["object_key"] for row in rows}
