"""How often a schedule runs: an ISO 8601 duration read as steps from an anchor (docs/schedules.md: Due times).

Weeks, days, hours, minutes and seconds are fixed lengths; years and months are calendar steps in UTC,
counted from the anchor each time, with the day clamped to the month's end: ``P1M`` from January 31st is
February's last day, then March 31st (not the 28th). The k-th due time is the anchor moved by k times the
months, then by k times the fixed seconds.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# ISO 8601-1:2019 5.5.2.4 durations of whole units: years, months, weeks, days, then after T hours, minutes,
# seconds. Fractions are refused (a due time is a whole second), and so are digits outside ASCII and numbers
# too long to matter (each is then refused as too long by the limits below, not by int()).
_DURATION = re.compile(
    r"P(?:(?P<years>[0-9]{1,9})Y)?(?:(?P<months>[0-9]{1,9})M)?(?:(?P<weeks>[0-9]{1,9})W)?(?:(?P<days>[0-9]{1,9})D)?"
    r"(?:T(?=[0-9])(?:(?P<hours>[0-9]{1,12})H)?(?:(?P<minutes>[0-9]{1,12})M)?(?:(?P<seconds>[0-9]{1,12})S)?)?"
)
_FIXED_SECONDS = {"weeks": 7 * 86400, "days": 86400, "hours": 3600, "minutes": 60, "seconds": 1}
# Long enough for any schedule (a thousand years of months), short enough that no step overflows a datetime.
_MAX_MONTHS = 12_000
_MAX_SECONDS = 1000 * 366 * 86400
_SHORTEST_MONTH_SECONDS = 28 * 86400
# The Gregorian calendar's mean month, 365.2425 / 12 days.
_AVERAGE_MONTH_SECONDS = 2_629_746


_DATE_DESIGNATORS = (("years", "Y"), ("months", "M"), ("weeks", "W"), ("days", "D"))
_TIME_DESIGNATORS = (("hours", "H"), ("minutes", "M"), ("seconds", "S"))


def _canonical(units: dict[str, int]) -> str:
    """The duration of ``units`` written without its zero units."""
    date = "".join(f"{units[name]}{letter}" for name, letter in _DATE_DESIGNATORS if units[name])
    time = "".join(f"{units[name]}{letter}" for name, letter in _TIME_DESIGNATORS if units[name])
    return f"P{date}T{time}" if time else f"P{date}"


class CadenceError(ValueError):
    """An ``every`` that is not a usable duration; ``code`` is the problem code that answers it."""

    code = "SCHEDULE_INTERVAL_INVALID"


@dataclass(frozen=True)
class Cadence:
    """A schedule's interval: ``months`` calendar months and ``seconds`` fixed seconds, not both zero;
    ``text`` is the duration in its canonical form, which the schedule shows and its key's replay compares: upper
    case, without zero units or leading zeros (``p0y0m1dt0h`` is ``P1D``).
    """

    text: str
    months: int
    seconds: int

    @classmethod
    def parse(cls, text: str) -> Cadence:
        """Read an ISO 8601 duration such as ``P1D``, ``PT6H``, ``P1M`` or ``P1Y2M10DT2H30M``.

        Raises ``CadenceError`` for anything else: another syntax, a fraction, a zero duration, or more
        than a thousand years.
        """
        # ASCII first: str.upper() maps some other letters to ASCII ones (U+017F to "S").
        match = _DURATION.fullmatch(text.upper()) if text.isascii() else None
        if match is None or text.upper() in ("P", "PT"):
            raise CadenceError("not an ISO 8601 duration of whole units, such as P1D or PT6H")
        units = {name: int(value) for name, value in match.groupdict(default="0").items()}
        months = 12 * units["years"] + units["months"]
        seconds = sum(units[name] * length for name, length in _FIXED_SECONDS.items())
        if months == 0 and seconds == 0:
            raise CadenceError("the interval must be longer than zero")
        if months > _MAX_MONTHS or seconds > _MAX_SECONDS:
            raise CadenceError("the interval must be at most a thousand years")
        return cls(_canonical(units), months, seconds)

    @property
    def min_seconds(self) -> int:
        """The shortest time between two due times, in seconds (a month counts as 28 days)."""
        return self.months * _SHORTEST_MONTH_SECONDS + self.seconds

    def due_at(self, anchor: datetime, k: int) -> datetime:
        """The ``k``-th due time (k >= 0) from ``anchor`` (aware), in UTC."""
        start = anchor.astimezone(UTC)
        if self.months:
            month_index = start.month - 1 + k * self.months
            year, month = start.year + month_index // 12, month_index % 12 + 1
            start = start.replace(year=year, month=month, day=min(start.day, calendar.monthrange(year, month)[1]))
        return start + timedelta(seconds=k * self.seconds)

    def latest_due(self, anchor: datetime, now: datetime) -> datetime | None:
        """The last due time at or before ``now``: what a run fired at ``now`` is keyed by, every missed one
        before it coalesced into it (docs/schedules.md: Runs). None before the anchor.
        """
        if now < anchor:
            return None
        return self.due_at(anchor, self._first_after(anchor, now) - 1)

    def next_due(self, anchor: datetime, after: datetime) -> datetime:
        """The first due time strictly after ``after``: the anchor itself when ``after`` is before it."""
        return self.due_at(anchor, self._first_after(anchor, after))

    def _first_after(self, anchor: datetime, instant: datetime) -> int:
        """The least k whose due time is after ``instant``: estimated from the average lengths, then
        stepped to the exact one (a step or two at most: calendar months stray little from their average).
        """
        average = self.months * _AVERAGE_MONTH_SECONDS + self.seconds
        k = max(0, int((instant - anchor).total_seconds() // average))
        while self.due_at(anchor, k) <= instant:
            k += 1
        while k > 0 and self.due_at(anchor, k - 1) > instant:
            k -= 1
        return k
