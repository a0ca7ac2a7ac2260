"""Timestamps as the API prints them: RFC 3339, UTC, millisecond precision, ``Z`` suffix (README: API reference,
The file)."""

from __future__ import annotations

import re
from datetime import UTC, datetime


def format_timestamp(value: datetime | None) -> str | None:
    """Render an aware datetime as ``2026-11-30T08:00:00.000Z``; ``None`` stays ``None``."""
    if value is None:
        return None
    utc = value.astimezone(UTC)
    # The year by hand: strftime("%Y") does not zero-pad years before 1000 on glibc.
    return f"{utc.year:04d}-" + utc.strftime("%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


# RFC 3339 section 5.6 date-time (fromisoformat alone also takes week dates, spaces and basic format).
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)

# Accepted years, in UTC. Postgres stores the extremes of Python's range as -infinity/infinity, which
# no timestamp string can show, and RFC 3339 has four-digit years.
MIN_YEAR, MAX_YEAR = 1000, 9999


def parse_timestamp(text: str) -> datetime:
    """Parse an RFC 3339 timestamp with an offset or ``Z``, truncated to milliseconds, in UTC.

    Raises ``ValueError`` for anything else: no zone, or a UTC year outside ``MIN_YEAR``..``MAX_YEAR``.
    """
    if not _RFC3339.fullmatch(text):
        raise ValueError("not an RFC 3339 date-time with a zone offset or Z")
    value = datetime.fromisoformat(text.upper())
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        raise ValueError("timestamp out of range") from None
    if not MIN_YEAR <= utc.year <= MAX_YEAR:
        raise ValueError(f"timestamp year must be {MIN_YEAR}-{MAX_YEAR} in UTC")
    return utc.replace(microsecond=utc.microsecond // 1000 * 1000)
