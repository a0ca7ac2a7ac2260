"""Timestamps as the API prints them: RFC 3339, UTC, millisecond precision, ``Z`` suffix (docs/api.md: Submitting an
export, The file)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta


def format_timestamp(value: datetime | None) -> str | None:
    """Render an aware datetime as ``2026-11-30T08:00:00.000Z``; ``None`` stays ``None``."""
    if value is None:
        return None
    # isoformat, unlike strftime("%Y") on glibc, zero-pads years before 1000, and it is twice as fast: this
    # runs a few times in every poll. Its first 23 characters end at the milliseconds, before the offset.
    return value.astimezone(UTC).isoformat(timespec="milliseconds")[:23] + "Z"


# RFC 3339 section 5.6 date-time (fromisoformat alone also takes week dates, spaces and basic format).
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
)

# Accepted years, in UTC. Postgres stores the extremes of Python's range as -infinity/infinity, which
# no timestamp string can show, and RFC 3339 has four-digit years.
MIN_YEAR, MAX_YEAR = 1000, 9999


def parse_timestamp(text: str) -> datetime:
    """Parse an RFC 3339 timestamp with an offset or ``Z``, truncated to milliseconds, in UTC.

    Raises ``ValueError`` for anything else: no zone, an offset outside RFC 3339's (hours 00-23, minutes
    00-59), or a UTC year outside ``MIN_YEAR``..``MAX_YEAR``.
    """
    instant = parse_instant(text)
    return instant.replace(microsecond=instant.microsecond // 1000 * 1000)


def parse_instant(text: str) -> datetime:
    """``parse_timestamp`` without the truncation: the instant to the microsecond (digits beyond are cut)."""
    if not _RFC3339.fullmatch(text):
        raise ValueError("not an RFC 3339 date-time with a zone offset or Z")
    value = datetime.fromisoformat(text.upper())
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        raise ValueError("timestamp out of range") from None
    if not MIN_YEAR <= utc.year <= MAX_YEAR:
        raise ValueError(f"timestamp year must be {MIN_YEAR}-{MAX_YEAR} in UTC")
    return utc


def ceil_millisecond(value: datetime) -> datetime:
    """The first whole millisecond at or after ``value``: for every millisecond-precision time ``t`` (what the
    message store keeps), ``t >= value`` exactly when ``t >= ceil_millisecond(value)``, and likewise for ``<``.
    """
    below = value.replace(microsecond=value.microsecond // 1000 * 1000)
    return below if below == value else below + timedelta(milliseconds=1)
