"""Conditional requests (RFC 9110 section 13): the preconditions of a GET or HEAD of a result, evaluated in the
order of section 13.2.2, whether ``If-Range`` lets a ``Range`` apply, and the entity-tag list comparison that
the status monitor's ``If-None-Match`` shares.

A result never changes once published (its key, size and sha256 are fixed with SUCCEEDED), so its ETag
(the quoted sha256) and its ``Last-Modified`` (the second it was published) are both strong validators
(docs/api.md: Downloads, Conditional downloads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime
from enum import Enum

from multidict import CIMultiDictProxy

from services.api.http.fields import field_list, sole_field

# One element of a list of entity-tags (RFC 9110 section 8.8.3): optional whitespace, then an optional
# weakness prefix and quoted opaque tag with its trailing whitespace, or nothing (an empty element), then a
# comma or the end. The whitespace after a tag sits inside the tag's group: two adjacent runs of it would
# backtrack in time quadratic in a long run of spaces.
_LIST_ELEMENT = re.compile(r'[ \t]*(?:(W/)?"([\x21\x23-\x7e\x80-\xff]*)"[ \t]*)?(?:,|\Z)')


class PreconditionOutcome(Enum):
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

    def evaluate(self, headers: CIMultiDictProxy[str]) -> PreconditionOutcome:
        """Evaluate ``If-Match``, ``If-Unmodified-Since``, ``If-None-Match`` and ``If-Modified-Since`` in the
        order of RFC 9110 section 13.2.2 for a GET or HEAD (the only methods of a result). A list field's
        lines are one list; a date field sent twice, or holding anything but one HTTP-date, is ignored.
        """
        if_match = field_list(headers, "If-Match")
        if if_match is not None:
            if not self._matches(if_match, weak=False):
                return PreconditionOutcome.PRECONDITION_FAILED
        else:
            since = http_date(sole_field(headers, "If-Unmodified-Since"))
            if since is not None and self._seconds > since:
                return PreconditionOutcome.PRECONDITION_FAILED
        if_none_match = field_list(headers, "If-None-Match")
        if if_none_match is not None:
            if self._matches(if_none_match, weak=True):
                return PreconditionOutcome.NOT_MODIFIED
        else:
            since = http_date(sole_field(headers, "If-Modified-Since"))
            if since is not None and self._seconds <= since:
                return PreconditionOutcome.NOT_MODIFIED
        return PreconditionOutcome.PROCEED

    def range_applies(self, headers: CIMultiDictProxy[str]) -> bool:
        """True when a ``Range`` may be honoured given ``If-Range`` (RFC 9110 section 13.1.5): absent, a
        strong match of the ETag (a weak tag never matches), or exactly ``Last-Modified`` as an HTTP-date.
        Anything else, a malformed or repeated field included, asks for the whole file.
        """
        if "If-Range" not in headers:
            return True
        value = sole_field(headers, "If-Range")
        if value is None:
            return False
        value = value.strip(" \t")
        if value.startswith(('"', "W/")):
            return value == self.etag_header
        return http_date(value) == self._seconds

    def _matches(self, field: str, *, weak: bool) -> bool:
        return tag_list_matches(field, self.etag, weak=weak)


def tag_list_matches(field: str, tag: str, *, weak: bool) -> bool:
    """Whether the list ``field`` (``*`` or entity-tags; empty elements are allowed, RFC 9110 section 5.6.1)
    names the representation whose opaque tag (without quotes) is ``tag``, comparing strongly (``If-Match``)
    or weakly (``If-None-Match``, RFC 9110 section 8.8.3.2). A list that does not parse, wherever the fault,
    matches nothing.
    """
    text = field.strip(" \t")
    if text == "*":
        return True
    elements = _elements(text)
    return elements is not None and any(element == tag and (weak or not is_weak) for is_weak, element in elements)


def _elements(text: str) -> list[tuple[bool, str]] | None:
    """The (weak, opaque tag) elements of a list of entity-tags, empty ones left out; None when it does not parse."""
    elements, position = [], 0
    while position < len(text):
        found = _LIST_ELEMENT.match(text, position)
        if found is None or found.end() == position:
            return None
        is_weak, element = found.groups()
        if element is not None:
            elements.append((is_weak is not None, element))
        position = found.end()
    return elements


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_TIME = r"([0-9]{2}):([0-9]{2}):([0-9]{2})"
_MONTH = "(" + "|".join(_MONTHS) + ")"
# The three forms of RFC 9110 section 5.6.7, exactly: IMF-fixdate, the obsolete RFC 850 and asctime forms.
_IMF_FIXDATE = re.compile(rf"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), ([0-9]{{2}}) {_MONTH} ([0-9]{{4}}) {_TIME} GMT")
_RFC850_DATE = re.compile(
    rf"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), ([0-9]{{2}})-{_MONTH}-([0-9]{{2}}) {_TIME} GMT"
)
_ASCTIME_DATE = re.compile(rf"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) {_MONTH} ([0-9 ][0-9]) {_TIME} ([0-9]{{4}})")


def http_date(value: str | None) -> datetime | None:
    """An HTTP-date (RFC 9110 section 5.6.7: IMF-fixdate or one of the two obsolete forms, case-sensitive,
    in GMT) as an aware UTC datetime; None when absent or anything else: another zone, a missing weekday, a
    list of dates, a date that does not exist. RFC 9110 sections 13.1.3 and 13.1.4 say to ignore such a
    field rather than guess.
    """
    if value is None:
        return None
    value = value.strip(" \t")
    try:
        if found := _IMF_FIXDATE.fullmatch(value):
            day, month, year, *clock = found.groups()
            return _utc(int(year), month, day, clock)
        if found := _RFC850_DATE.fullmatch(value):
            day, month, year, *clock = found.groups()
            return _utc(_rfc850_year(int(year)), month, day, clock)
        if found := _ASCTIME_DATE.fullmatch(value):
            month, day, *clock, year = found.groups()
            return _utc(int(year), month, day, clock)
    except ValueError:  # 31 Feb, 25:00:00 and the like
        return None
    return None


def _utc(year: int, month: str, day: str, clock: list[str]) -> datetime:
    hour, minute, second = (int(part) for part in clock)
    return datetime(year, _MONTHS.index(month) + 1, int(day), hour, minute, second, tzinfo=UTC)


def _rfc850_year(two_digits: int) -> int:
    """RFC 9110 section 5.6.7: a two-digit year more than 50 years ahead is the latest such year past."""
    this_year = datetime.now(UTC).year
    year = this_year - this_year % 100 + two_digits
    return year - 100 if year > this_year + 50 else year
