"""Timestamps as the contract prints them: RFC 3339, UTC, millisecond precision, ``Z`` suffix (5.6)."""

from __future__ import annotations

from datetime import UTC, datetime

# The same format in SQL, for lines that Postgres renders itself (worker export).
SQL_FORMAT = 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'


def format_timestamp(value: datetime | None) -> str | None:
    """Render an aware datetime as ``2026-11-30T08:00:00.000Z``; ``None`` stays ``None``."""
    if value is None:
        return None
    utc = value.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def parse_timestamp(text: str) -> datetime:
    """Parse an RFC 3339 timestamp with an offset or ``Z``, truncated to milliseconds.

    Raises ``ValueError`` for anything else, including a timestamp without a zone.
    """
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        raise ValueError("timestamp needs a zone offset or Z")
    return value.astimezone(UTC).replace(microsecond=value.microsecond // 1000 * 1000)
