"""The export reader: the messages an export attempt reads from the message store, range by range of seqs,
as JSONL lines Postgres renders (streamed by COPY) or as rows for the formats the worker renders, and the
size of a range (docs/api.md: Submitting an export, The file; docs/api.md: Submitting an export, Export options).

Read only: every function is one short statement on the caller's connection, so no snapshot stays open
across an export.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from shared.export.rendering import JSONL_LINE_SQL
from shared.export.request import ExportRequest
from shared.repository.chunks import PlannedRange
from shared.repository.message_store import ATTACHMENTS_SQL, REPLY_TO_SQL
from shared.repository.rows import Row

# Every message of one export range, recalled or not; and those of them an export writes when its options select
# every message.
_RANGE_MESSAGES = "FROM messages WHERE conversation_id = $1 AND seq > $2 AND seq <= $3"
_UNRECALLED_MESSAGES = f"{_RANGE_MESSAGES} AND recalled_at IS NULL"
# The messages of one export range that the request's options select (docs/api.md: Submitting an export, Export
# options): since inclusive, until exclusive, on sent_at; only the listed senders.
_SELECTED_MESSAGES = f"""
{_UNRECALLED_MESSAGES}
  AND ($4::timestamptz IS NULL OR sent_at >= $4) AND ($5::timestamptz IS NULL OR sent_at < $5)
  AND ($6::text[] IS NULL OR sender_id = ANY($6::text[]))
"""
# The conversation's edit version the export's first claim fixed (migration 0023): $7 is the operation's id. NULL
# for an id of no operation (a benchmark's bare read), which shows every body as it is now.
_EDIT_SNAPSHOT = "(SELECT coalesce(o.snapshot_edit_version, 0) FROM operations o WHERE o.operation_id = $7)"


def _as_of_snapshot(column: str) -> str:
    """``column`` (``body`` or ``edited_at``) of a message as of the export's edit snapshot (docs/api.md: Message
    store, Replies and edits): what the first edit after the snapshot replaced, or the column when none did.
    Only a message edited after the snapshot costs a lookup.
    """
    return f"""CASE WHEN messages.edit_version > {_EDIT_SNAPSHOT} THEN (
        SELECT e.previous_{column} FROM message_edits e
        WHERE e.conversation_id = messages.conversation_id AND e.seq = messages.seq
          AND e.edit_version > {_EDIT_SNAPSHOT}
        ORDER BY e.edit_version LIMIT 1) ELSE messages.{column} END"""


# The selected messages as the export shows them, a column for each of message_shape.FIELDS.
_SHOWN = f"""(
    SELECT conversation_id, seq, message_id, sender_id, sent_at, {_as_of_snapshot("body")} AS body,
           {REPLY_TO_SQL} AS reply_to, {_as_of_snapshot("edited_at")} AS edited_at, {ATTACHMENTS_SQL} AS attachments
    {_SELECTED_MESSAGES}) shown"""
_ROW_COLUMNS = f"seq, message_id, sender_id, sent_at, body, reply_to, edited_at, attachments, {JSONL_LINE_SQL} AS line"

# JSONL lines are rendered by Postgres (docs/api.md: Submitting an export, The file). A range's lines reach Python
# as one value, the bytes of every line in seq order, newline included (bytea, which asyncpg hands over without
# decoding text): no row of its own per line. The parameters are _SHOWN's; the benchmarks' COPY of the same lines
# uses the text, a row each (``EXPORT_LINES_SQL``).
EXPORT_LINES_SQL = f"SELECT {JSONL_LINE_SQL} FROM {_SHOWN} ORDER BY seq"
_EXPORT_LINE_BYTES_SQL = (
    f"SELECT convert_to(string_agg({JSONL_LINE_SQL} || E'\\n', '' ORDER BY seq), 'UTF8') FROM {_SHOWN}"
)
_EXPORT_ROWS_SQL = f"SELECT {_ROW_COLUMNS} FROM {_SHOWN} ORDER BY seq"
_LAST_ROW_SQL = f"SELECT {_ROW_COLUMNS} FROM {_SHOWN} ORDER BY seq DESC LIMIT 1"


def _options(request: ExportRequest) -> tuple[datetime | None, datetime | None, list[str] | None]:
    """``_SELECTED_MESSAGES``' parameters $4 to $6: the request's options that select messages."""
    return request.since, request.until, None if request.senders is None else list(request.senders)


def _selection(
    request: ExportRequest, operation_id: str
) -> tuple[datetime | None, datetime | None, list[str] | None, str]:
    """``_SHOWN``'s parameters $4 to $7: the options, and the export whose edit snapshot the bodies are shown at."""
    return (*_options(request), operation_id)


async def fetch_export_lines(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    conversation_id: str,
    after_seq: int,
    last_seq: int,
    request: ExportRequest,
) -> bytes:
    """The JSONL export lines of the messages ``request`` selects among seqs ``after_seq < seq <= last_seq``,
    one ``\\n``-terminated line per message, each body as of the edit snapshot of export ``operation_id``.

    One short statement: no snapshot stays open across the export (a snapshot held open holds back vacuum
    of every table, the outbox included). A query, not a ``COPY``: asyncpg prepares it once per connection,
    while a ``COPY`` with arguments costs two more round trips and a parse of the statement every time; and one
    value, not a row per line, which would cost the worker as much CPU as Postgres spends rendering them
    (docs/benchmark.md: The read of an export's lines).
    """
    try:
        lines: bytes | None = await conn.fetchval(
            _EXPORT_LINE_BYTES_SQL, conversation_id, after_seq, last_seq, *_selection(request, operation_id)
        )
    except asyncpg.ProgramLimitExceededError:
        # Over the 1 GB one value may hold (a range sized from small messages that met large ones): each half
        # on its own, down to a single message.
        if last_seq - after_seq < 2:
            raise
        middle = (after_seq + last_seq) // 2
        halves = [(after_seq, middle), (middle, last_seq)]
        return b"".join(
            [
                await fetch_export_lines(
                    conn,
                    operation_id=operation_id,
                    conversation_id=conversation_id,
                    after_seq=low,
                    last_seq=high,
                    request=request,
                )
                for low, high in halves
            ]
        )
    return lines or b""


# A request with no option that leaves a message out: what ``range_bytes`` and ``plan_ranges`` weigh by default.
_EVERY_MESSAGE = ExportRequest()
# About what an export line adds to its body (the other fields and the JSON around them), in bytes.
LINE_OVERHEAD_BYTES = 160


async def range_bytes(
    conn: asyncpg.Connection,
    *,
    conversation_id: str,
    after_seq: int,
    last_seq: int,
    recalled: bool = True,
    request: ExportRequest = _EVERY_MESSAGE,
) -> int:
    """About the JSONL bytes of messages of seqs ``after_seq < seq <= last_seq``: with ``recalled``, every one,
    recalled messages too (what a range of the same seqs may hold, which a read's size must allow for);
    without, those an export of ``request`` writes: the ones its options select, by default every one not
    recalled (what chunks are planned on). Reads sizes only (a compressed or out-of-line body is not
    decompressed).
    """
    weighed: tuple[object, ...] = ()
    if recalled:
        sql = f"SELECT coalesce(sum(octet_length(body) + $4), 0) {_RANGE_MESSAGES}"
    else:
        sql, weighed = f"SELECT coalesce(sum(octet_length(body) + $7), 0) {_SELECTED_MESSAGES}", _options(request)
    size: int = await conn.fetchval(sql, conversation_id, after_seq, last_seq, *weighed, LINE_OVERHEAD_BYTES)
    return size


async def plan_ranges(
    conn: asyncpg.Connection,
    *,
    conversation_id: str,
    after_seq: int,
    last_seq: int,
    target_bytes: int,
    request: ExportRequest = _EVERY_MESSAGE,
) -> list[PlannedRange]:
    """Cut the seqs ``after_seq < seq <= last_seq`` into contiguous ranges of about ``target_bytes`` each, as
    ``range_bytes`` without ``recalled`` measures them for ``request`` (so bodies of any size weigh what they
    hold, not one each, and a message the export does not write, recalled or left out by a filter, weighs
    nothing): a range ends with the message that takes it to the next multiple of ``target_bytes``
    (docs/chunks.md: The plan). The first range starts at ``after_seq`` and the last ends at ``last_seq``;
    empty when the seqs hold no message the export writes.
    """
    rows = await conn.fetch(
        f"""
        SELECT max(seq) AS high, sum(size) AS size FROM (
            SELECT seq, size, sum(size) OVER (ORDER BY seq) - size AS before FROM (
                SELECT seq, octet_length(body) + $8 AS size {_SELECTED_MESSAGES}) sized) placed
        GROUP BY floor(before / $7) ORDER BY high
        """,
        conversation_id,
        after_seq,
        last_seq,
        *_options(request),
        target_bytes,
        LINE_OVERHEAD_BYTES,
    )
    highs = [row["high"] for row in rows]
    if highs:
        highs[-1] = last_seq
    lows = [after_seq, *highs[:-1]]
    return [PlannedRange(low, high, row["size"]) for low, high, row in zip(lows, highs, rows, strict=True)]


@dataclass(frozen=True)
class ExportRow(Row):
    """One exported message (``shared.export.message_shape.ExportedMessage``): its fields, and ``line``, its JSONL line
    without the newline (as ``fetch_export_lines`` writes it)."""

    seq: int
    message_id: str
    sender_id: str
    sent_at: datetime
    body: str
    line: str
    reply_to: str | None = None
    edited_at: datetime | None = None
    attachments: str | None = None


async def fetch_export_rows(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    conversation_id: str,
    after_seq: int,
    last_seq: int,
    request: ExportRequest,
) -> list[ExportRow]:
    """The messages ``fetch_export_lines`` would write, one row each, for formats rendered message by message.

    One short statement, like ``fetch_export_lines``.
    """
    rows = await conn.fetch(_EXPORT_ROWS_SQL, conversation_id, after_seq, last_seq, *_selection(request, operation_id))
    return [ExportRow.from_row(row) for row in rows]


async def last_export_row(
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    conversation_id: str,
    after_seq: int,
    last_seq: int,
    request: ExportRequest,
) -> ExportRow | None:
    """The last of the messages ``fetch_export_rows`` would give for the same arguments, or None when there
    is none: what a chunk's renderer goes on from (docs/chunks.md: Chunked exports).
    """
    row = await conn.fetchrow(_LAST_ROW_SQL, conversation_id, after_seq, last_seq, *_selection(request, operation_id))
    return None if row is None else ExportRow.from_row(row)


@dataclass(frozen=True)
class CarriedAttachment(Row):
    """A stored attachment that an export's messages carry: what a ZIP with media needs of it (docs/api.md:
    Submitting an export, Exports with media)."""

    attachment_id: str
    file_name: str
    content_type: str
    size_bytes: int
    sha256: str
    crc32: int
    object_key: str
    created_at: datetime


async def carried_attachments(
    conn: asyncpg.Connection, *, conversation_id: str, after_seq: int, last_seq: int, request: ExportRequest
) -> list[CarriedAttachment]:
    """Every attachment the messages ``request`` selects among seqs ``after_seq < seq <= last_seq`` carry, once
    each, in the order the file first shows them (by seq, then by its place in the message). One short
    statement.
    """
    rows = await conn.fetch(
        f"""
        SELECT a.attachment_id, a.file_name, a.content_type, a.size_bytes, a.sha256, a.crc32, a.object_key,
               a.created_at
        FROM (SELECT DISTINCT ON (c.attachment_id) c.attachment_id, c.seq, c.position
              FROM message_attachments c
              WHERE c.conversation_id = $1
                AND c.seq IN (SELECT seq {_SELECTED_MESSAGES} AND attachment_count IS NOT NULL)
              ORDER BY c.attachment_id, c.seq, c.position) first
        JOIN attachments a USING (attachment_id)
        ORDER BY first.seq, first.position
        """,
        conversation_id,
        after_seq,
        last_seq,
        *_options(request),
    )
    return [CarriedAttachment.from_row(row) for row in rows]
