"""How a file of each format renders messages (docs/api.md: Submitting an export, Export options; The file): a header,
one piece per message, a footer, so that every file (and every part of a split result) is complete on its own.

A renderer keeps state within one file only (the HTML day it is in), so each file gets a new one; which
renderer a format has is its entry in ``shared.export.formats.FORMATS``. JSONL lines are rendered by Postgres, the
export's fast path (COPY hands them over without a row ever becoming Python objects): ``JSONL_LINE_SQL`` is
that rendering, kept here with the other formats'.
"""

from __future__ import annotations

import csv
import html
import io
import json
import urllib.parse
from typing import Any, Protocol

from shared import jsontext
from shared.export.formulas import guarded
from shared.export.message_shape import FIELDS, OPTIONAL_FIELDS, ExportedMessage, message_values
from shared.jsontext import LINE_BREAKING
from shared.timefmt import format_timestamp


class Renderer(Protocol):
    """Renders one file: ``header()``, then ``message(row)`` for each message in seq order, then ``footer()``;
    ``footer_at_most`` is the most bytes ``footer()`` may return, whatever came before. ``carries_over``: a
    message's rendering depends on the message before it; ``continue_after(row)`` then makes the renderer go
    on as if it had rendered ``row`` last (a chunk after the first, docs/chunks.md: Chunked exports).
    """

    footer_at_most: int
    carries_over: bool

    def header(self) -> bytes: ...

    def message(self, row: ExportedMessage) -> bytes: ...

    def footer(self) -> bytes: ...

    def continue_after(self, row: ExportedMessage) -> None: ...


class _Stateless:
    """What a renderer that keeps no state between messages shares: nothing to carry over."""

    carries_over = False

    def continue_after(self, row: ExportedMessage) -> None:
        """Nothing to do: no message depends on the one before."""


def _timestamp_json(column: str) -> str:
    """The JSON string of timestamp ``column`` as ``shared.timefmt`` prints timestamps in the API."""
    return f"""'"' || to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') || '"'"""


# Each field's JSON value as Postgres writes it: to_json escapes exactly as json.dumps(ensure_ascii=False) does,
# and times are printed as shared.timefmt prints them in the API. NULL for an optional field without a value.
_JSON_OF_FIELD = {
    "conversation_id": "to_json(conversation_id)::text",
    "seq": "seq",
    "message_id": "to_json(message_id)::text",
    "sender_id": "to_json(sender_id)::text",
    "sent_at": _timestamp_json("sent_at"),
    "body": "to_json(body)::text",
    "reply_to": "to_json(reply_to)::text",
    "edited_at": _timestamp_json("edited_at"),
    # Already JSON text (shared.repository.message_store.ATTACHMENTS_SQL).
    "attachments": "attachments",
}


def _jsonl_line_sql() -> str:
    """A message's JSONL line as a SQL expression over a relation with a column of each of ``FIELDS`` (the
    export reader's messages as of the export's snapshot): the ``FIELDS`` of the read API's message, in order, an
    ``OPTIONAL_FIELDS`` member only when its value is not NULL, and ``shared.jsontext.LINE_BREAKING`` escaped as
    ``shared.jsontext`` escapes them, so that every line is one line for every reader and the file matches the
    read API byte for byte.
    """
    members = []
    for number, name in enumerate(FIELDS):
        member = f"""'{"," if number else "{"}"{name}":' || {_JSON_OF_FIELD[name]}"""
        # NULL || text is NULL: a member without a value is left out whole (never the first one).
        members.append(f"coalesce({member}, '')" if name in OPTIONAL_FIELDS else member)
    line = f"{' || '.join(members)} || '}}'"
    for char in LINE_BREAKING:
        line = f"replace({line}, chr({ord(char)}), '\\u{ord(char):04x}')"
    return line


JSONL_LINE_SQL = _jsonl_line_sql()


class JsonLines(_Stateless):
    """JSONL: one ``message_shape.message_json`` object per line, the line Postgres rendered with
    ``JSONL_LINE_SQL`` (``ExportedMessage.line``).
    """

    footer_at_most = 0

    def header(self) -> bytes:
        return b""

    def message(self, row: ExportedMessage) -> bytes:
        return row.line.encode() + b"\n"

    def footer(self) -> bytes:
        return b""


class Csv(_Stateless):
    """CSV (RFC 4180): a header row of the ``FIELDS``, then one row per message with the read API's values
    (an empty cell for an optional field without one), CRLF line ends, UTF-8; every text cell goes through
    ``formulas.guarded``, so that none of those that hold what users chose (ids and body) runs as a formula (the
    times, which the service writes, cannot start like one).
    """

    footer_at_most = 0

    def __init__(self, conversation_id: str) -> None:
        self._conversation_id = conversation_id
        self._text = io.StringIO()
        self._writer = csv.writer(self._text, lineterminator="\r\n")

    def header(self) -> bytes:
        return self._row(FIELDS)

    def message(self, row: ExportedMessage) -> bytes:
        shown = message_values({"conversation_id": self._conversation_id, **vars(row)})
        return self._row(tuple([_cell(value) for value in shown.values()]))

    def footer(self) -> bytes:
        return b""

    def _row(self, cells: tuple[str, ...]) -> bytes:
        self._text.seek(0)
        self._text.truncate()
        self._writer.writerow(cells)
        return self._text.getvalue().encode()


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        # A message's attachments: their JSON, as the JSONL line holds it.
        return jsontext.dumps(value, separators=(",", ":"))
    return guarded(value) if type(value) is str else str(value)


_HTML_HEAD = """<!DOCTYPE html>
<html lang="und">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Conversation {title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 50rem; margin: 2rem auto; padding: 0 1rem; }}
h2 {{ font-size: 1rem; border-bottom: 1px solid #ccc; }}
.meta {{ color: #555; font-size: 0.85rem; margin: 0.8rem 0 0.1rem; }}
.sender {{ font-weight: bold; color: #222; }}
.body {{ white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; }}
.reply {{ color: #555; font-size: 0.85rem; margin: 0; }}
.edited {{ color: #555; }}
.attachments {{ margin: 0.2rem 0 0; padding-left: 1.2rem; font-size: 0.9rem; }}
.attachments img {{ max-width: 100%; max-height: 24rem; }}
</style>
</head>
<body>
<h1>Conversation <span dir="auto">{title}</span></h1>
"""
_HTML_DAY_END = "</section>\n"
_HTML_END = "</body>\n</html>\n"


class Html:
    """One self-contained HTML document: the messages grouped by day (UTC), each with sender, time (UTC),
    an "(edited)" mark with the edit's time, the message_id of the message it replies to, body and the
    names, sizes and types of its attachments; every
    text escaped, ``dir="auto"`` on text a user wrote, no script and no external resource.
    """

    footer_at_most = len(_HTML_DAY_END) + len(_HTML_END)
    carries_over = True  # a day's section opens with its first message and closes at the next day's

    def __init__(self, conversation_id: str) -> None:
        self._conversation_id = conversation_id
        self._day: str | None = None

    def continue_after(self, row: ExportedMessage) -> None:
        """Go on inside the day section of ``row``, which the file holds before this renderer's messages."""
        self._day = _stamp(row)[:10]

    def header(self) -> bytes:
        return _HTML_HEAD.format(title=html.escape(self._conversation_id)).encode()

    def message(self, row: ExportedMessage) -> bytes:
        stamp = _stamp(row)
        day, time = stamp[:10], stamp[11:19]
        opening = ""
        if day != self._day:
            opening = (_HTML_DAY_END if self._day is not None else "") + (
                f'<section>\n<h2><time datetime="{day}">{day}</time></h2>\n'
            )
            self._day = day
        return (
            f'{opening}<article id="m{row.seq}">\n'
            f'<p class="meta"><span class="sender" dir="auto">{html.escape(row.sender_id)}</span> '
            f'<time datetime="{stamp}">{time} UTC</time>{_html_edited(row)}</p>\n'
            f"{_html_reply(row)}"
            f'<p class="body" dir="auto">{html.escape(row.body)}</p>\n{_html_attachments(row)}</article>\n'
        ).encode()

    def footer(self) -> bytes:
        return ((_HTML_DAY_END if self._day is not None else "") + _HTML_END).encode()


def _stamp(row: ExportedMessage) -> str:
    return format_timestamp(row.sent_at) or ""


def _html_edited(row: ExportedMessage) -> str:
    edited = format_timestamp(row.edited_at)
    return "" if edited is None else f' <span class="edited">(edited <time datetime="{edited}">{edited}</time>)</span>'


def attachments_of(row: ExportedMessage) -> list[dict[str, Any]]:
    """The attachments ``row`` carries, each a dict of ``message_shape.ATTACHMENT_FIELDS``; empty for none."""
    return [] if row.attachments is None else list(json.loads(row.attachments))


# Shown inline from a ZIP's media folder: raster images, which carry no script. SVG, HTML and the rest are links,
# which a browser opens only when the reader asks (docs/api.md: Submitting an export, Exports with media).
INLINE_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp", "image/avif", "image/bmp"})


_BIDI_SHOWN = {code: "\ufffd" for code in (0x200E, 0x200F, 0x061C, *range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def _html_attachments(row: ExportedMessage) -> str:
    items = "".join(_html_attachment(item) for item in attachments_of(row))
    return f'<ul class="attachments">\n{items}</ul>\n' if items else ""


def _html_attachment(item: dict[str, Any]) -> str:
    """One attachment: its name, size and type; in a ZIP with media, a link to its file (and the image itself
    when it is a raster image), or why it was left out."""
    # A file name's bidirectional controls could make "gnp.exe" read as "exe.png": shown as U+FFFD instead.
    name = f'<span dir="auto">{html.escape(item["file_name"].translate(_BIDI_SHOWN))}</span>'
    about = f"{item['size_bytes']} bytes, {html.escape(item['content_type'])}"
    if "left_out" in item:
        return f"<li>{name} ({about}; not in this archive: {html.escape(item['left_out'])})</li>\n"
    if "path" not in item:
        return f"<li>{name} ({about})</li>\n"
    href = html.escape(urllib.parse.quote(item["path"]))
    image = ""
    if item["content_type"].lower() in INLINE_IMAGE_TYPES:
        image = f'<br><img src="{href}" alt="{html.escape(item["file_name"])}" loading="lazy">'
    return f'<li><a href="{href}">{name}</a> ({about}){image}</li>\n'


def _html_reply(row: ExportedMessage) -> str:
    # The id only, not a link: the message may be outside the file (another part, recalled, left out by the
    # options), and the file links to nothing.
    if row.reply_to is None:
        return ""
    return f'<p class="reply">In reply to <span dir="auto">{html.escape(row.reply_to)}</span></p>\n'


# str.splitlines() ends a line at each of these as well as at LF and CR (Python's documentation of str.splitlines).
_OTHER_LINE_BREAKS = "\v\f\x1c\x1d\x1e\x85\u2028\u2029"
# What a terminal acts on when a file is printed to it: the C0 controls but tab (ESC starts its escape
# sequences), DEL, the C1 controls (U+009B is a CSI of its own), and the bidirectional embedding, override and
# isolate controls, which reorder what is shown around them (CVE-2021-42574, "Trojan Source").
TERMINAL_CONTROLS = "".join(
    chr(code) for code in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if chr(code) not in "\t\n\r"
) + "".join(map(chr, (*range(0x202A, 0x202F), *range(0x2066, 0x206A))))
_TEXT_ESCAPES = {
    ord("\\"): "\\\\",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    **{ord(char): f"\\u{ord(char):04x}" for char in _OTHER_LINE_BREAKS + TERMINAL_CONTROLS},
}


class Text(_Stateless):
    """TXT, the plain text DiscordChatExporter's users know: one line per message in seq order,
    ``[2026-03-01 12:30:00.000Z] alice: body`` (the time in UTC, as the API prints it with a space for the
    ``T``), UTF-8, no header; a reply reads ``alice (reply to m-7): body``, an edited message
    ``alice (edited): body``, both ``alice (reply to m-7) (edited): body``; each attachment follows the body as
    `` [attachment: photo.png (51200 bytes)]``. In a body (and a reply's message id, an attachment's file
    name) a backslash is written ``\\\\``, a line feed ``\\n``, a carriage
    return ``\\r`` and every other character ``str.splitlines()`` ends a line at, and every one of
    ``TERMINAL_CONTROLS``, ``\\uXXXX``, so that ``splitlines()`` counts messages and printing the file to a
    terminal runs nothing a member wrote; a sender id cannot hold any of them (``shared.ids``).
    """

    footer_at_most = 0

    def header(self) -> bytes:
        return b""

    def message(self, row: ExportedMessage) -> bytes:
        stamp = (format_timestamp(row.sent_at) or "").replace("T", " ")
        marks = "" if row.reply_to is None else f" (reply to {row.reply_to.translate(_TEXT_ESCAPES)})"
        if row.edited_at is not None:
            marks += " (edited)"
        attached = "".join(_text_attachment(item) for item in attachments_of(row))
        return f"[{stamp}] {row.sender_id}{marks}: {row.body.translate(_TEXT_ESCAPES)}{attached}\n".encode()

    def footer(self) -> bytes:
        return b""


def _text_attachment(item: dict[str, Any]) -> str:
    """`` [attachment: photo.png (51200 bytes)]``, with its member in a ZIP with media (`` media/...``) or why it
    was left out (`` left out: too_large``)."""
    where = ""
    if "path" in item:
        where = f" {item['path'].translate(_TEXT_ESCAPES)}"
    elif "left_out" in item:
        where = f" left out: {item['left_out']}"
    return f" [attachment: {item['file_name'].translate(_TEXT_ESCAPES)} ({item['size_bytes']} bytes){where}]"
