"""The kinds of file an export writes (docs/api.md: Submitting an export, Export options): the registry of formats, the
compressions, and what follows from them: the file name's extension, the stored object's content type, the
renderer, the part size floor.

``FORMATS`` is the one list of formats: the API's request and response types, its OpenAPI document and the
worker's choice of renderer derive from it, and a test compares the database's CHECK constraint with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from shared.export.rendering import Csv, Html, JsonLines, Renderer, Text


@dataclass(frozen=True)
class Format:
    """One export format: its ``name`` (the request's ``format``), the stored object's ``content_type`` when it
    is not compressed, ``description`` (the file, for the API document), ``renderer`` (a new renderer for one
    file of the conversation whose id it is given), and ``postgres_renders``: whether Postgres renders its
    file whole (``rendering.JSONL_LINE_SQL``) when it is not split.
    """

    name: str
    content_type: str
    description: str
    renderer: Callable[[str], Renderer]
    postgres_renders: bool = False

    @property
    def extension(self) -> str:
        """The file name's extension without its dot: the format's name (docs/api.md: Submitting an export, Export
        options), which the command-line client relies on.
        """
        return self.name


FORMATS: Final = {
    entry.name: entry
    for entry in (
        Format(
            "jsonl",
            "application/x-ndjson",
            "UTF-8, one `Message` JSON object per line in ascending seq, each line ending in `\\n`.",
            lambda conversation_id: JsonLines(),
            postgres_renders=True,
        ),
        Format(
            "csv",
            "text/csv; charset=utf-8",
            "RFC 4180 with a header row, one row per message; a text cell starting with `=`, `+`, `-`, `@`, tab or "
            "CR starts with `'`.",
            Csv,
        ),
        Format(
            "html",
            "text/html; charset=utf-8",
            "One self-contained transcript, grouped by day (UTC), replies and edits marked.",
            Html,
        ),
        Format(
            "txt",
            "text/plain; charset=utf-8",
            "UTF-8, one line per message in ascending seq, `[2026-03-01 12:30:00.000Z] alice: body` (UTC), with "
            "`(reply to m-7)` and `(edited)` after the sender when they apply; in a "
            "body `\\` is written `\\\\`, a line feed `\\n`, a carriage return `\\r` and every other line "
            "break of `str.splitlines()` `\\uXXXX`.",
            lambda conversation_id: Text(),
        ),
    )
}
FORMAT_NAMES: Final = tuple(FORMATS)
COMPRESSIONS: Final = ("none", "gzip")
DEFAULT_FORMAT: Final = "jsonl"
DEFAULT_COMPRESSION: Final = "none"
# The smallest max_part_bytes: S3's smallest multipart part, so that no part is split into tiny requests.
MIN_PART_BYTES = 5 * 1024 * 1024

GZIP_CONTENT_TYPE = "application/gzip"
ZIP_CONTENT_TYPE = "application/zip"
CONTENT_TYPES: Final = (*(entry.content_type for entry in FORMATS.values()), GZIP_CONTENT_TYPE, ZIP_CONTENT_TYPE)


@dataclass(frozen=True)
class FileKind:
    """A ``format`` of ``FORMATS`` stored with a ``compression`` of ``COMPRESSIONS``, or ``zipped``: a ZIP holding
    the format's file (never compressed then) with the media its messages carry (docs/api.md: Submitting an
    export, Exports with media).
    """

    format: str = DEFAULT_FORMAT
    compression: str = DEFAULT_COMPRESSION
    zipped: bool = False

    @property
    def compressed(self) -> bool:
        """True when the stored bytes are gzip."""
        return self.compression == "gzip"

    @property
    def extension(self) -> str:
        """The file name's extension without its dot: the format's, with ``.gz`` when compressed; ``zip`` when
        zipped.
        """
        if self.zipped:
            return "zip"
        extension = FORMATS[self.format].extension
        return f"{extension}.gz" if self.compressed else extension

    @property
    def content_type(self) -> str:
        """The stored object's media type: the format's, ``application/gzip`` when compressed, ``application/zip``
        when zipped.
        """
        if self.zipped:
            return ZIP_CONTENT_TYPE
        return GZIP_CONTENT_TYPE if self.compressed else FORMATS[self.format].content_type

    @property
    def postgres_renders(self) -> bool:
        """True when Postgres renders a file of this format whole (``Format.postgres_renders``); never in a ZIP
        with media, whose messages show where their files went.
        """
        return FORMATS[self.format].postgres_renders and not self.zipped

    def renderer(self, conversation_id: str) -> Renderer:
        """A new renderer for one file of ``conversation_id``."""
        return FORMATS[self.format].renderer(conversation_id)
