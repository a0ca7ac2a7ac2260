"""Single byte ranges of RFC 9110 section 14 for downloads (docs/api.md: Downloads, Download)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# ASCII digits only: \d would also match other scripts' digits.
_SINGLE_RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)")
# Larger than any file; longer digit strings are read as this instead of as a huge int.
_BEYOND_ANY_FILE = 10**18


class RangeNotSatisfiable(Exception):
    """The range lies wholly outside the representation (answer 416 with ``Content-Range: bytes */N``)."""


@dataclass(frozen=True)
class ByteRange:
    """Inclusive byte positions ``first``..``last`` of a representation ``size`` bytes long."""

    first: int
    last: int
    size: int

    @property
    def length(self) -> int:
        """Number of bytes in the range."""
        return self.last - self.first + 1

    def content_range(self) -> str:
        """The ``Content-Range`` header value of a 206."""
        return f"bytes {self.first}-{self.last}/{self.size}"

    def s3_range(self) -> str:
        """The ``Range`` argument of S3 GetObject for these bytes."""
        return f"bytes={self.first}-{self.last}"


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The range a ``Range`` header asks for, or None to send the whole representation.

    Headers we do not support (several ranges, other units, bad syntax) are ignored, as RFC 9110 allows.
    Raises ``RangeNotSatisfiable`` when the one range starts beyond the end or the file is empty.
    """
    match = _SINGLE_RANGE.fullmatch(header.strip()) if header else None
    if match is None or match.group(1) == match.group(2) == "":
        return None
    first_text, last_text = match.groups()
    if first_text == "":
        suffix = _position(last_text)
        if suffix == 0 or size == 0:
            raise RangeNotSatisfiable
        return ByteRange(max(0, size - suffix), size - 1, size)
    first = _position(first_text)
    last = None if last_text == "" else _position(last_text)
    if last is not None and last < first:
        return None  # last < first is invalid syntax: ignore the header
    if first >= size:
        raise RangeNotSatisfiable
    return ByteRange(first, size - 1 if last is None else min(last, size - 1), size)


def _position(digits: str) -> int:
    return int(digits) if len(digits) <= 18 else _BEYOND_ANY_FILE
