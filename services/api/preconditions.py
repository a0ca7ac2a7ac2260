"""Conditional requests on a download (RFC 9110 section 13): the preconditions of a GET or HEAD of a result,
evaluated in the order of section 13.2.2, and whether ``If-Range`` lets a ``Range`` apply.

A result never changes once published (its key, size and sha256 are fixed with SUCCEEDED), so its ETag
(the quoted sha256) and its ``Last-Modified`` (the second it was published) are both strong validators
(README: API reference, Conditional downloads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime, parsedate_to_datetime
from enum import Enum

from multidict import CIMultiDictProxy

# An entity-tag (RFC 9110 section 8.8.3): an optional weakness prefix and a quoted opaque tag.
_ENTITY_TAG = re.compile(r'\s*(W/)?"([\x21\x23-\x7e\x80-\xff]*)"\s*(?:,|$)')


class Outcome(Enum):
    """What the preconditions decided: go on, answer 304 Not Modified, or answer 412."""

    PROCEED = "PROCEED"
    NOT_MODIFIED = "NOT_MODIFIED"
    PRECONDITION_FAILED = "PRECONDITION_FAILED"


@dataclass(frozen=True)
class Validators:
    """The current representation's validators: ``etag`` the opaque tag without quotes, ``last_modified``
    the publication time (any precision; HTTP compares whole seconds).
    """

    etag: str
    last_modified: datetime

    @property
    def etag_header(self) -> str:
        """The ``ETag`` field value: the strong, quoted tag."""
        return f'"{self.etag}"'

    @property
    def last_modified_header(self) -> str:
        """The ``Last-Modified`` field value as an IMF-fixdate."""
        return format_datetime(self._seconds, usegmt=True)

    @property
    def _seconds(self) -> datetime:
        return self.last_modified.astimezone(UTC).replace(microsecond=0)

    def evaluate(self, headers: CIMultiDictProxy[str]) -> Outcome:
        """Evaluate ``If-Match``, ``If-Unmodified-Since``, ``If-None-Match`` and ``If-Modified-Since`` in the
        order of RFC 9110 section 13.2.2 for a GET or HEAD (the only methods of a result).
        """
        if_match = headers.get("If-Match")
        if if_match is not None:
            if not self._matches(if_match, weak=False):
                return Outcome.PRECONDITION_FAILED
        else:
            since = _http_date(headers.get("If-Unmodified-Since"))
            if since is not None and self._seconds > since:
                return Outcome.PRECONDITION_FAILED
        if_none_match = headers.get("If-None-Match")
        if if_none_match is not None:
            if self._matches(if_none_match, weak=True):
                return Outcome.NOT_MODIFIED
        else:
            since = _http_date(headers.get("If-Modified-Since"))
            if since is not None and self._seconds <= since:
                return Outcome.NOT_MODIFIED
        return Outcome.PROCEED

    def range_applies(self, if_range: str | None) -> bool:
        """True when a ``Range`` may be honoured given ``If-Range`` (RFC 9110 section 13.1.5): absent, a
        strong match of the ETag (a weak tag never matches), or exactly ``Last-Modified`` as an HTTP-date.
        Anything else, malformed values included, asks for the whole file.
        """
        if if_range is None:
            return True
        value = if_range.strip()
        if value.startswith(('"', "W/")):
            return value == self.etag_header
        return _http_date(value) == self._seconds

    def _matches(self, field: str, *, weak: bool) -> bool:
        """Whether the list ``field`` (``*`` or entity-tags) names this representation, comparing strongly
        (``If-Match``) or weakly (``If-None-Match``). A list that does not parse matches nothing.
        """
        if field.strip() == "*":
            return True
        position, text = 0, field.strip()
        while position < len(text):
            found = _ENTITY_TAG.match(text, position)
            if found is None:
                return False
            is_weak, tag = found.groups()
            if tag == self.etag and (weak or not is_weak):
                return True
            position = found.end()
        return False


def _http_date(value: str | None) -> datetime | None:
    """An HTTP-date as an aware UTC datetime, or None when absent or invalid (which RFC 9110 section 13.1.3
    and 13.1.4 say to ignore).
    """
    if value is None:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
