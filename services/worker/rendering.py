"""How a file of each format renders messages (README: API reference, Export options): a header, one piece
per message, a footer, so that every file (and every part of a split result) is complete on its own.

A renderer keeps state within one file only (the HTML day it is in), so each file gets a new one.
"""

from __future__ import annotations

import csv
import html
import io
from typing import Protocol

from services.worker.formulas import guarded
from shared.repository.conversations import ExportRow
from shared.timefmt import format_timestamp

CSV_COLUMNS = ("conversation_id", "seq", "message_id", "sender_id", "sent_at", "body")


class Renderer(Protocol):
    """Renders one file: ``header()``, then ``message(row)`` for each message in seq order, then ``footer()``;
    ``footer_at_most`` is the most bytes ``footer()`` may return, whatever came before.
    """

    footer_at_most: int

    def header(self) -> bytes: ...

    def message(self, row: ExportRow) -> bytes: ...

    def footer(self) -> bytes: ...


class JsonLines:
    """JSONL: the line Postgres rendered (``conversations.ExportRow.line``), one per message."""

    footer_at_most = 0

    def header(self) -> bytes:
        return b""

    def message(self, row: ExportRow) -> bytes:
        return row.line.encode() + b"\n"

    def footer(self) -> bytes:
        return b""


class Csv:
    """CSV (RFC 4180): a header row, then one row per message, CRLF line ends, UTF-8; every text cell that
    holds what users chose (ids and body) goes through ``formulas.guarded``, so none runs as a formula.
    """

    footer_at_most = 0

    def __init__(self, conversation_id: str) -> None:
        self._conversation_id = conversation_id
        self._text = io.StringIO()
        self._writer = csv.writer(self._text, lineterminator="\r\n")

    def header(self) -> bytes:
        return self._row(CSV_COLUMNS)

    def message(self, row: ExportRow) -> bytes:
        return self._row(
            (
                guarded(self._conversation_id),
                str(row.seq),
                guarded(row.message_id),
                guarded(row.sender_id),
                format_timestamp(row.sent_at) or "",
                guarded(row.body),
            )
        )

    def footer(self) -> bytes:
        return b""

    def _row(self, cells: tuple[str, ...]) -> bytes:
        self._text.seek(0)
        self._text.truncate()
        self._writer.writerow(cells)
        return self._text.getvalue().encode()


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
</style>
</head>
<body>
<h1>Conversation <span dir="auto">{title}</span></h1>
"""
_HTML_DAY_END = "</section>\n"
_HTML_END = "</body>\n</html>\n"


def renderer(file_format: str, conversation_id: str) -> Renderer:
    """A new renderer of ``file_format`` (``shared.formats.FORMATS``) for one file of ``conversation_id``."""
    if file_format == "csv":
        return Csv(conversation_id)
    if file_format == "html":
        return Html(conversation_id)
    return JsonLines()


class Html:
    """One self-contained HTML document: the messages grouped by day (UTC), each with sender, time (UTC)
    and body; every text escaped, ``dir="auto"`` on text a user wrote, no script and no external resource.
    """

    footer_at_most = len(_HTML_DAY_END) + len(_HTML_END)

    def __init__(self, conversation_id: str) -> None:
        self._conversation_id = conversation_id
        self._day: str | None = None

    def header(self) -> bytes:
        return _HTML_HEAD.format(title=html.escape(self._conversation_id)).encode()

    def message(self, row: ExportRow) -> bytes:
        stamp = format_timestamp(row.sent_at) or ""
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
            f'<time datetime="{stamp}">{time} UTC</time></p>\n'
            f'<p class="body" dir="auto">{html.escape(row.body)}</p>\n</article>\n'
        ).encode()

    def footer(self) -> bytes:
        return ((_HTML_DAY_END if self._day is not None else "") + _HTML_END).encode()
