"""Due times of a schedule's interval (docs/schedules.md: Due times): fixed lengths and calendar steps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.export.cadence import Cadence, CadenceError


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def test_a_month_from_january_31st_is_februarys_last_day_then_march_31st() -> None:
    every = Cadence.parse("P1M")
    anchor = at(2027, 1, 31, 10)
    assert [every.due_at(anchor, k) for k in range(4)] == [
        at(2027, 1, 31, 10),
        at(2027, 2, 28, 10),
        at(2027, 3, 31, 10),
        at(2027, 4, 30, 10),
    ]
    assert every.due_at(at(2028, 1, 31), 1) == at(2028, 2, 29)
    assert every.next_due(anchor, anchor) == at(2027, 2, 28, 10)


def test_years_and_months_are_calendar_steps_and_the_rest_fixed() -> None:
    every = Cadence.parse("p1y2m1dt1h")
    assert (every.text, every.months, every.seconds) == ("P1Y2M1DT1H", 14, 90000)
    assert every.due_at(at(2027, 12, 31), 1) == at(2029, 2, 28) + timedelta(days=1, hours=1)
    assert Cadence.parse("P2W").seconds == 14 * 86400


@pytest.mark.parametrize("every", ["PT1S", "PT7M", "PT1H", "P1D", "P1W", "P1M", "P3M", "P1Y", "P1M15D", "PT90M"])
def test_latest_and_next_due_bracket_every_instant(every: str) -> None:
    cadence = Cadence.parse(every)
    anchor = at(2027, 1, 31, 23, 59, 59)
    for offset in (0, 1, 59, 3600, 86400 * 29, 86400 * 400, 86400 * 3650):
        now = anchor + timedelta(seconds=offset)
        latest = cadence.latest_due(anchor, now)
        following = cadence.next_due(anchor, now)
        assert latest is not None and latest <= now < following
        assert cadence.next_due(anchor, latest) == following


def test_before_the_anchor_nothing_is_due_and_the_anchor_comes_next() -> None:
    every = Cadence.parse("P1D")
    anchor = at(2027, 5, 1)
    assert every.latest_due(anchor, anchor - timedelta(seconds=1)) is None
    assert every.next_due(anchor, anchor - timedelta(days=3)) == anchor


@pytest.mark.parametrize(
    "text",
    [
        "",
        "P",
        "PT",
        "P0D",
        "PT0S",
        "P1.5D",
        "1D",
        "P1DT",
        "PT1H1D",
        "P-1D",
        "R5/P1D",
        "P1000001Y",
        "P١D",
        " P1D",
        "P1D\n",
        "\u00a0P1D",
        "PT3600\u017f",
    ],
)
def test_anything_but_a_whole_positive_duration_is_refused(text: str) -> None:
    with pytest.raises(CadenceError) as refused:
        Cadence.parse(text)
    assert refused.value.code == "SCHEDULE_INTERVAL_INVALID"


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("P1D", "P1D"),
        ("p1d", "P1D"),
        ("P000000001D", "P1D"),
        ("P0Y0M0DT1H", "PT1H"),
        ("P1Y0M2W", "P1Y2W"),
        ("PT0H90M", "PT90M"),
    ],
)
def test_the_interval_is_kept_in_its_canonical_form(text: str, canonical: str) -> None:
    assert Cadence.parse(text).text == canonical


def test_min_seconds_counts_a_month_as_28_days() -> None:
    assert Cadence.parse("P1M").min_seconds == 28 * 86400
    assert Cadence.parse("PT1H").min_seconds == 3600
