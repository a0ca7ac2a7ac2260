"""The message store: the ``conversations``, ``conversation_members`` and ``messages`` tables as the API and
the admin write and read them, sends, recalls, reads, membership and imports (docs/api.md: Message
store). What an export reads of the messages is ``export_reader``.

Every function that writes messages first takes the conversation's row lock (``conversations.last_seq``),
so stores and imports of one conversation run one at a time: seqs are strictly increasing, gapless among
committed messages and never reused. Functions that need more than one statement open their own
transaction, a savepoint when the caller already has one, so the CLI can call them on a bare connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import NamedTuple, Protocol

import asyncpg

from shared.export.message_shape import ATTACHMENT_FIELDS
from shared.ids import is_valid_id
from shared.repository.rows import Row
from shared.states import MAY_WRITE_AGAIN, values


class DuplicateMessageId(Exception):
    """A message with this ``message_id`` is already stored in the conversation, recalled or not."""


class ConversationNotFound(Exception):
    """The conversation does not exist."""


class ReplyTargetNotFound(Exception):
    """The message a reply names is not stored in the conversation, or was recalled."""


class AttachmentNotFound(Exception):
    """An attachment a send names is not one the sender stored in the conversation."""


def _attachments_sql() -> str:
    """The attachments a row of an unaliased ``messages`` carries, as the JSON text of the message's
    ``attachments`` (``shared.export.message_shape.ATTACHMENT_FIELDS`` of each, in order, written as
    ``shared.jsontext`` writes JSON), NULL for none; only a message with an ``attachment_count`` costs a lookup.
    """
    members = " || ',' || ".join(f"""'"{name}":' || to_json(a.{name})::text""" for name in ATTACHMENT_FIELDS)
    return f"""CASE WHEN messages.attachment_count IS NOT NULL THEN (
    SELECT '[' || string_agg('{{' || {members} || '}}', ',' ORDER BY c.position) || ']'
    FROM message_attachments c JOIN attachments a USING (attachment_id)
    WHERE c.conversation_id = messages.conversation_id AND c.seq = messages.seq) END"""


ATTACHMENTS_SQL = _attachments_sql()

# The message_id of the message a row of ``messages`` replies to, NULL when it replies to none: a SQL expression
# over an unaliased ``messages`` (docs/api.md: Message store, Replies and edits).
REPLY_TO_SQL = """CASE WHEN messages.reply_to_seq IS NOT NULL THEN (
    SELECT t.message_id FROM messages t
    WHERE t.conversation_id = messages.conversation_id AND t.seq = messages.reply_to_seq) END"""


class ImportLine(Protocol):
    """One message to import: the fields of an admin import NDJSON line (docs/api.md: Message store)."""

    @property
    def message_id(self) -> str: ...

    @property
    def sender_id(self) -> str: ...

    @property
    def body(self) -> str: ...

    @property
    def sent_at(self) -> datetime | None: ...


class ImportResult(NamedTuple):
    """Outcome of one import: lines stored, and lines skipped because their ``message_id`` was known."""

    imported: int
    skipped: int


_MEMBER_SQL = "SELECT 1 FROM conversation_members WHERE conversation_id = $1 AND user_id = $2"
# The SQL function (migration 0017) that the claim's and the SUCCEEDED commit's functions call too.
_MEMBER_LOCKED_SQL = "SELECT 1 WHERE member_locked($1, $2)"


async def is_member(conn: asyncpg.Connection, *, conversation_id: str, user_id: str, lock: bool = False) -> bool:
    """True when ``user_id`` is currently a member of ``conversation_id``.

    An id that breaks the id syntax (``shared.ids``) cannot be stored, so it is answered False without a
    query: a path segment with U+0000 never reaches Postgres, and it gets the same 404 as any other
    conversation the caller cannot see (docs/api.md: Error codes). With ``lock`` the membership row is
    share-locked until the caller's transaction ends, so a removal waits for it: that makes "still a member"
    and "commit SUCCEEDED" one atomic decision (docs/states.md: States and failure model).
    """
    if not (is_valid_id(conversation_id) and is_valid_id(user_id)):
        return False
    query = _MEMBER_LOCKED_SQL if lock else _MEMBER_SQL
    found = await conn.fetchval(query, conversation_id, user_id)
    return found is not None


async def put_members(conn: asyncpg.Connection, *, conversation_id: str, members: Sequence[str]) -> None:
    """Create ``conversation_id`` if it is missing and make ``members`` its exact member set (docs/api.md: Message
    store).

    One statement, so it is atomic on its own; repeated ids in ``members`` count once. Members that stay
    keep their ``added_at``.
    """
    # The conversation row and the member rows go in one statement: the foreign key is checked at the
    # statement's end, after the CTE inserted the conversation.
    await conn.execute(
        """
        WITH conversation AS (
            INSERT INTO conversations (conversation_id) VALUES ($1) ON CONFLICT DO NOTHING
        ), removed AS (
            DELETE FROM conversation_members WHERE conversation_id = $1 AND user_id <> ALL ($2::text[])
        )
        INSERT INTO conversation_members (conversation_id, user_id)
        SELECT DISTINCT $1, member FROM unnest($2::text[]) AS member
        ON CONFLICT DO NOTHING
        """,
        conversation_id,
        list(members),
    )


@dataclass(frozen=True)
class ConversationSummary(Row):
    """The admin view of a conversation (``conversation_summary``)."""

    conversation_id: str
    members: list[str]
    last_seq: int
    message_count: int


async def conversation_summary(conn: asyncpg.Connection, *, conversation_id: str) -> ConversationSummary | None:
    """The admin view of a conversation, ``(conversation_id, members, last_seq, message_count)``, or None
    when it does not exist (docs/api.md: Administration, Admin view of a conversation).

    ``members`` are the user ids in code point order; ``last_seq`` is the last seq handed out (recalled
    messages keep theirs); ``message_count`` counts the messages not recalled, by a scan of the
    conversation's messages. One statement, so all three are read as of one moment.
    """
    # COLLATE "C" sorts by code point, as clients' own sorting does, whatever the database's locale.
    row = await conn.fetchrow(
        """
        SELECT c.conversation_id,
               ARRAY(SELECT m.user_id FROM conversation_members m WHERE m.conversation_id = c.conversation_id
                     ORDER BY m.user_id COLLATE "C") AS members,
               c.last_seq,
               (SELECT count(*) FROM messages g
                WHERE g.conversation_id = c.conversation_id AND g.recalled_at IS NULL) AS message_count
        FROM conversations c WHERE c.conversation_id = $1
        """,
        conversation_id,
    )
    return None if row is None else ConversationSummary.from_row(row)


async def add_member(conn: asyncpg.Connection, *, conversation_id: str, user_id: str) -> bool:
    """Make ``user_id`` a member (idempotent); False when the conversation is missing (for a 404)."""
    exists: bool = await conn.fetchval(
        """
        WITH conversation AS (
            SELECT conversation_id FROM conversations WHERE conversation_id = $1
        ), added AS (
            INSERT INTO conversation_members (conversation_id, user_id)
            SELECT conversation_id, $2 FROM conversation
            ON CONFLICT DO NOTHING
        )
        SELECT EXISTS (SELECT 1 FROM conversation)
        """,
        conversation_id,
        user_id,
    )
    return exists


async def remove_member(conn: asyncpg.Connection, *, conversation_id: str, user_id: str) -> bool:
    """Remove ``user_id`` as a member (idempotent); False when the conversation is missing (for a 404)."""
    exists: bool = await conn.fetchval(
        """
        WITH removed AS (
            DELETE FROM conversation_members WHERE conversation_id = $1 AND user_id = $2
        )
        SELECT EXISTS (SELECT 1 FROM conversations WHERE conversation_id = $1)
        """,
        conversation_id,
        user_id,
    )
    return exists


@dataclass(frozen=True)
class StoredSeq(Row):
    """Where ``store_message`` stored a message: its seq and the time it was stored."""

    seq: int
    sent_at: datetime


async def store_message(
    conn: asyncpg.Connection,
    *,
    conversation_id: str,
    message_id: str,
    sender_id: str,
    body: str,
    reply_to: str | None = None,
    attachments: Sequence[str] = (),
) -> StoredSeq:
    """Store one message with the next seq, replying to the message whose message_id is ``reply_to`` when
    given, carrying the ``attachments`` (ids, in order; each an attachment ``sender_id`` stored in the
    conversation, docs/api.md: Message store, Attachments); return its ``StoredSeq``.

    ``sent_at`` is the database's ``now()`` cut to milliseconds, the precision the API and the export file print
    (docs/api.md: Submitting an export, The file). Raises ``ConversationNotFound``, ``DuplicateMessageId``
    (docs/api.md: Message store: even when the body is identical), ``ReplyTargetNotFound`` (docs/api.md:
    Message store, Replies and edits) and ``AttachmentNotFound`` with the first id that is not attachable; each
    leaves the conversation's ``last_seq`` as it was and stores nothing.
    """
    async with conn.transaction():
        # The row lock taken here is held until the (outer) transaction ends: one writer at a time.
        seq = await conn.fetchval(
            "UPDATE conversations SET last_seq = last_seq + 1 WHERE conversation_id = $1 RETURNING last_seq",
            conversation_id,
        )
        if seq is None:
            raise ConversationNotFound(conversation_id)
        stored = await conn.fetchrow(
            """
            INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at, reply_to_seq,
                                  attachment_count)
            VALUES ($1, $2, $3, $4, $5, date_trunc('milliseconds', now()),
                    (SELECT t.seq FROM messages t
                     WHERE t.conversation_id = $1 AND t.message_id = $6 AND t.recalled_at IS NULL),
                    nullif($7::smallint, 0))
            ON CONFLICT ON CONSTRAINT messages_conversation_message_id DO NOTHING
            RETURNING seq, sent_at, reply_to_seq
            """,
            conversation_id,
            seq,
            message_id,
            sender_id,
            body,
            reply_to,
            len(attachments),
        )
        # Raising inside the transaction rolls the seq bump back, so no seq is burnt.
        if stored is None:
            raise DuplicateMessageId(message_id)
        if reply_to is not None and stored["reply_to_seq"] is None:
            raise ReplyTargetNotFound(reply_to)
        if attachments:
            await _carry(conn, conversation_id=conversation_id, seq=seq, sender_id=sender_id, ids=attachments)
        return StoredSeq(seq=stored["seq"], sent_at=stored["sent_at"])


async def _carry(
    conn: asyncpg.Connection, *, conversation_id: str, seq: int, sender_id: str, ids: Sequence[str]
) -> None:
    """Make message ``seq`` carry the attachments ``ids`` in order; raises ``AttachmentNotFound`` with the first
    that is not STORED in the conversation by ``sender_id``.
    """
    carried = await conn.fetch(
        """
        INSERT INTO message_attachments (conversation_id, seq, position, attachment_id)
        SELECT $1, $2, wanted.position, a.attachment_id
        FROM unnest($3::text[]) WITH ORDINALITY AS wanted (attachment_id, position)
        JOIN attachments a ON a.attachment_id = wanted.attachment_id
        WHERE a.conversation_id = $1 AND a.uploader_id = $4 AND a.state = 'STORED'
        RETURNING attachment_id
        """,
        conversation_id,
        seq,
        list(ids),
        sender_id,
    )
    found = {row["attachment_id"] for row in carried}
    missing = [attachment_id for attachment_id in ids if attachment_id not in found]
    if missing:
        raise AttachmentNotFound(missing[0])


class EditOutcome(StrEnum):
    """What ``edit_message`` did."""

    EDITED = "edited"
    # The body was the message's body already: nothing changed, as for a PATCH sent again.
    UNCHANGED = "unchanged"
    NOT_FOUND = "not_found"


@dataclass(frozen=True)
class EditedMessage:
    """``edit_message``'s answer: its ``outcome``, and for a message found, its ``seq`` and ``edited_at``
    (None for a message never edited whose body was sent unchanged).
    """

    outcome: EditOutcome
    seq: int | None = None
    edited_at: datetime | None = None


class _NothingEdited(Exception):
    """Rolls an edit's version bump back when it edits nothing; its argument is the ``EditedMessage`` to answer."""


async def edit_message(
    conn: asyncpg.Connection, *, conversation_id: str, message_id: str, sender_id: str, body: str
) -> EditedMessage:
    """Replace the body of a message ``sender_id`` sent and did not recall (docs/api.md: Message store, Replies
    and edits); NOT_FOUND for any other message, a missing one or conversation.

    The edit takes the conversation's next edit version under its row lock, as a send takes the next seq, and
    keeps the body it replaces (with its edit time) in ``message_edits`` under that version, so that an export
    shows each body as of the version its first claim fixed (``export_reader``). ``edited_at`` is the
    database's ``now()`` cut to milliseconds. A body equal to the current one changes nothing (UNCHANGED).
    """
    try:
        async with conn.transaction():
            version = await conn.fetchval(
                "UPDATE conversations SET last_edit_version = last_edit_version + 1 WHERE conversation_id = $1 "
                "RETURNING last_edit_version",
                conversation_id,
            )
            current = await conn.fetchrow(
                """
                SELECT seq, body, edited_at FROM messages
                WHERE conversation_id = $1 AND message_id = $2 AND sender_id = $3 AND recalled_at IS NULL
                """,
                conversation_id,
                message_id,
                sender_id,
            )
            if version is None or current is None:
                raise _NothingEdited(EditedMessage(EditOutcome.NOT_FOUND))
            if current["body"] == body:
                raise _NothingEdited(EditedMessage(EditOutcome.UNCHANGED, current["seq"], current["edited_at"]))
            edited_at = await conn.fetchval(
                """
                WITH kept AS (
                    INSERT INTO message_edits (conversation_id, seq, edit_version, previous_body, previous_edited_at)
                    VALUES ($1, $2, $3, $5, $6)
                )
                UPDATE messages SET body = $4, edited_at = date_trunc('milliseconds', now()), edit_version = $3
                WHERE conversation_id = $1 AND seq = $2
                RETURNING edited_at
                """,
                conversation_id,
                current["seq"],
                version,
                body,
                current["body"],
                current["edited_at"],
            )
            return EditedMessage(EditOutcome.EDITED, current["seq"], edited_at)
    except _NothingEdited as nothing:
        result: EditedMessage = nothing.args[0]
        return result


async def recall_message(conn: asyncpg.Connection, *, conversation_id: str, message_id: str, sender_id: str) -> bool:
    """Mark the message recalled; False unless ``sender_id`` sent it (docs/api.md: Message store: anyone
    else gets 404).

    Recalling again is a no-op that still answers True and keeps the first ``recalled_at``. The row is
    never deleted: its seq and message_id stay taken.
    """
    recalled = await conn.fetchval(
        """
        UPDATE messages SET recalled_at = coalesce(recalled_at, now())
        WHERE conversation_id = $1 AND message_id = $2 AND sender_id = $3
        RETURNING true
        """,
        conversation_id,
        message_id,
        sender_id,
    )
    return recalled is not None


async def prune_replaced_bodies(conn: asyncpg.Connection, *, limit: int) -> int:
    """Delete up to ``limit`` bodies that edits replaced (``message_edits``) and that no export may still show;
    return how many (docs/api.md: Message store, Replies and edits).

    An export in one of ``shared.states.MAY_WRITE_AGAIN`` shows the bodies as of its snapshot's edit version,
    so it needs every replaced body of a later version; one not yet claimed needs them all, since the version
    its claim fixes may be older than an edit that commits after it. Rows of a conversation with no such export
    all go.
    """
    deleted: int = await conn.fetchval(
        """
        WITH needed AS (
            SELECT conversation_id,
                   min(CASE WHEN snapshot_max_seq IS NULL THEN -1 ELSE coalesce(snapshot_edit_version, 0) END) AS above
            FROM operations WHERE state = ANY($1::text[]) GROUP BY conversation_id
        ), doomed AS (
            SELECT e.conversation_id, e.seq, e.edit_version
            FROM message_edits e LEFT JOIN needed n USING (conversation_id)
            WHERE n.above IS NULL OR e.edit_version <= n.above
            LIMIT $2
        ), gone AS (
            DELETE FROM message_edits d USING doomed
            WHERE (d.conversation_id, d.seq, d.edit_version) = (doomed.conversation_id, doomed.seq, doomed.edit_version)
            RETURNING 1
        )
        SELECT count(*) FROM gone
        """,
        values(MAY_WRITE_AGAIN),
        limit,
    )
    return deleted


@dataclass(frozen=True)
class ConversationListing(Row):
    """One conversation of a member's list (``list_conversations``)."""

    conversation_id: str
    last_seq: int
    last_message_at: datetime | None


async def list_conversations(
    conn: asyncpg.Connection, *, user_id: str, after: str | None, limit: int, search: str | None = None
) -> list[ConversationListing]:
    """Up to ``limit`` conversations ``user_id`` is a member of, ordered by id, after the id ``after``:
    (conversation_id, last_seq, last_message_at: the sent_at of the newest message not recalled, or NULL).
    With ``search``, only those whose id holds it, compared case-insensitively (its ``%``, ``_`` and ``\\``
    match themselves); the store keeps no titles.
    """
    rows = await conn.fetch(
        """
        SELECT c.conversation_id, c.last_seq,
               (SELECT g.sent_at FROM messages g
                WHERE g.conversation_id = c.conversation_id AND g.recalled_at IS NULL
                ORDER BY g.seq DESC LIMIT 1) AS last_message_at
        FROM conversation_members m JOIN conversations c USING (conversation_id)
        WHERE m.user_id = $1 AND ($2::text IS NULL OR c.conversation_id > $2)
          AND ($4::text IS NULL OR c.conversation_id ILIKE '%' || $4 || '%')
        ORDER BY c.conversation_id
        LIMIT $3
        """,
        user_id,
        after,
        limit,
        None if search is None else _like_literal(search),
    )
    return [ConversationListing.from_row(row) for row in rows]


def _like_literal(text: str) -> str:
    """``text`` for a LIKE pattern, matching itself: ``\\`` (LIKE's default escape), ``%`` and ``_`` escaped."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


async def read_messages(
    conn: asyncpg.Connection, *, conversation_id: str, after_seq: int, limit: int
) -> list[asyncpg.Record]:
    """Up to ``limit`` non-recalled messages with ``seq > after_seq``, in seq order, as they are now.

    Each record has a column of each of ``shared.export.message_shape.FIELDS``.
    """
    rows: list[asyncpg.Record] = await conn.fetch(
        f"""
        SELECT conversation_id, seq, message_id, sender_id, sent_at, body, {REPLY_TO_SQL} AS reply_to, edited_at,
               {ATTACHMENTS_SQL} AS attachments
        FROM messages
        WHERE conversation_id = $1 AND seq > $2 AND recalled_at IS NULL
        ORDER BY seq
        LIMIT $3
        """,
        conversation_id,
        after_seq,
        limit,
    )
    return rows


# Lines stored by one statement of an import; a transaction holds all of a request's chunks.
IMPORT_CHUNK_ROWS = 5000

_IMPORT_CHUNK_SQL = """
WITH batch AS (
    SELECT * FROM unnest($3::text[], $4::text[], $5::text[], $6::timestamptz[])
        WITH ORDINALITY AS line (message_id, sender_id, body, sent_at, line_no)
), first_seen AS (
    SELECT DISTINCT ON (message_id) * FROM batch ORDER BY message_id, line_no
), fresh AS (
    SELECT f.*, row_number() OVER (ORDER BY f.line_no) AS position
    FROM first_seen f
    WHERE NOT EXISTS (
        SELECT 1 FROM messages m WHERE m.conversation_id = $1 AND m.message_id = f.message_id
    )
), stored AS (
    INSERT INTO messages (conversation_id, seq, message_id, sender_id, body, sent_at)
    SELECT $1, $2 + position, message_id, sender_id, body,
           coalesce(sent_at, date_trunc('milliseconds', now()))
    FROM fresh ORDER BY position
    RETURNING 1
)
UPDATE conversations SET last_seq = $2 + (SELECT count(*) FROM stored)
WHERE conversation_id = $1
RETURNING last_seq - $2
"""


async def import_messages(
    conn: asyncpg.Connection, *, conversation_id: str, lines: Sequence[ImportLine]
) -> ImportResult:
    """Store ``lines`` with seqs in line order, skipping message_ids already stored (docs/api.md: Message
    store).

    A message_id repeated within ``lines`` is stored at its first occurrence and skipped after. A line
    without ``sent_at`` gets the database's ``now()`` cut to milliseconds. Set-based: one INSERT per
    ``IMPORT_CHUNK_ROWS`` lines, all in one transaction. Raises ``ConversationNotFound``; nothing is stored then.
    """
    imported = 0
    async with conn.transaction():
        last_seq = await conn.fetchval(
            "SELECT last_seq FROM conversations WHERE conversation_id = $1 FOR UPDATE", conversation_id
        )
        if last_seq is None:
            raise ConversationNotFound(conversation_id)
        # Under the row lock no other writer can add ids to this conversation, and each statement's
        # snapshot is taken after the lock was granted (and after the previous chunk), so the NOT EXISTS
        # filter sees every stored id. Chunks keep each statement well inside the statement timeout.
        for start in range(0, len(lines), IMPORT_CHUNK_ROWS):
            chunk = lines[start : start + IMPORT_CHUNK_ROWS]
            imported += await conn.fetchval(
                _IMPORT_CHUNK_SQL,
                conversation_id,
                last_seq + imported,
                [line.message_id for line in chunk],
                [line.sender_id for line in chunk],
                [line.body for line in chunk],
                [line.sent_at for line in chunk],
            )
    return ImportResult(imported=imported, skipped=len(lines) - imported)
