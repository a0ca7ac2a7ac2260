"""The kinds of file an export writes: format and compression, and what follows from them (README: API
reference, Export options): the file name's extension, the stored object's content type, the part size floor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

FORMATS = ("jsonl", "csv", "html")
COMPRESSIONS = ("none", "gzip")
DEFAULT_FORMAT: Final = "jsonl"
DEFAULT_COMPRESSION: Final = "none"
# The smallest max_part_bytes: S3's smallest multipart part, so that no part is split into tiny requests.
MIN_PART_BYTES = 5 * 1024 * 1024

_CONTENT_TYPES = {
    "jsonl": "application/x-ndjson",
    "csv": "text/csv; charset=utf-8",
    "html": "text/html; charset=utf-8",
}
GZIP_CONTENT_TYPE = "application/gzip"
CONTENT_TYPES = (*_CONTENT_TYPES.values(), GZIP_CONTENT_TYPE)


@dataclass(frozen=True)
class FileKind:
    """A ``format`` of ``FORMATS`` stored with a ``compression`` of ``COMPRESSIONS``."""

    format: str = DEFAULT_FORMAT
    compression: str = DEFAULT_COMPRESSION

    @property
    def compressed(self) -> bool:
        """True when the stored bytes are gzip."""
        return self.compression == "gzip"

    @property
    def extension(self) -> str:
        """The file name's extension without its dot: ``jsonl``, ``csv``, ``html``, each with ``.gz`` when
        compressed.
        """
        return f"{self.format}.gz" if self.compressed else self.format

    @property
    def content_type(self) -> str:
        """The stored object's media type: the format's, or ``application/gzip`` when compressed."""
        return GZIP_CONTENT_TYPE if self.compressed else _CONTENT_TYPES[self.format]

    @property
    def lines_are_messages(self) -> bool:
        """True when every stored line is one message (uncompressed JSONL), so counting lines counts messages."""
        return self.format == "jsonl" and not self.compressed
