"""Preconditions of a result download (RFC 9110 section 13): order of evaluation, strong and weak
comparison, HTTP-dates at one-second precision, and If-Range.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from services.api.http.preconditions import PreconditionOutcome, Validators, http_date

TAG = "0" * 63 + "a"
PUBLISHED = datetime(2026, 11, 30, 8, 0, 1, 250000, tzinfo=UTC)
VALIDATORS = Validators(etag=TAG, last_modified=PUBLISHED)
AT = "Mon, 30 Nov 2026 08:00:01 GMT"  # Last-Modified, to the second
BEFORE = "Mon, 30 Nov 2026 08:00:00 GMT"
AFTER = "Mon, 30 Nov 2026 08:00:02 GMT"


def headers(**fields: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict({name.replace("_", "-"): value for name, value in fields.items()}))


def test_validator_headers() -> None:
    assert VALIDATORS.etag_header == f'"{TAG}"'
    assert VALIDATORS.last_modified_header == AT


@pytest.mark.parametrize(
    ("fields", "outcome"),
    [
        ({}, PreconditionOutcome.PROCEED),
        ({"If_Match": f'"{TAG}"'}, PreconditionOutcome.PROCEED),
        ({"If_Match": f'"x", "{TAG}"'}, PreconditionOutcome.PROCEED),
        ({"If_Match": "*"}, PreconditionOutcome.PROCEED),
        ({"If_Match": f'W/"{TAG}"'}, PreconditionOutcome.PRECONDITION_FAILED),
        ({"If_Match": '"other"'}, PreconditionOutcome.PRECONDITION_FAILED),
        ({"If_Match": "not a tag"}, PreconditionOutcome.PRECONDITION_FAILED),
        ({"If_Unmodified_Since": AT}, PreconditionOutcome.PROCEED),
        ({"If_Unmodified_Since": AFTER}, PreconditionOutcome.PROCEED),
        ({"If_Unmodified_Since": BEFORE}, PreconditionOutcome.PRECONDITION_FAILED),
        ({"If_Unmodified_Since": "yesterday"}, PreconditionOutcome.PROCEED),
        # If-Match present: If-Unmodified-Since is not evaluated (13.2.2 step 2).
        ({"If_Match": f'"{TAG}"', "If_Unmodified_Since": BEFORE}, PreconditionOutcome.PROCEED),
        ({"If_None_Match": f'"{TAG}"'}, PreconditionOutcome.NOT_MODIFIED),
        ({"If_None_Match": f'W/"{TAG}"'}, PreconditionOutcome.NOT_MODIFIED),
        ({"If_None_Match": f'"a", W/"{TAG}"'}, PreconditionOutcome.NOT_MODIFIED),
        ({"If_None_Match": "*"}, PreconditionOutcome.NOT_MODIFIED),
        ({"If_None_Match": '"other"'}, PreconditionOutcome.PROCEED),
        ({"If_Modified_Since": AT}, PreconditionOutcome.NOT_MODIFIED),
        ({"If_Modified_Since": AFTER}, PreconditionOutcome.NOT_MODIFIED),
        ({"If_Modified_Since": BEFORE}, PreconditionOutcome.PROCEED),
        ({"If_Modified_Since": "garbage"}, PreconditionOutcome.PROCEED),
        # If-None-Match present: If-Modified-Since is not evaluated (step 4).
        ({"If_None_Match": '"other"', "If_Modified_Since": AFTER}, PreconditionOutcome.PROCEED),
        # If-Match fails first, whatever If-None-Match says (step 1 before step 3).
        ({"If_Match": '"other"', "If_None_Match": f'"{TAG}"'}, PreconditionOutcome.PRECONDITION_FAILED),
        ({"If_Unmodified_Since": BEFORE, "If_None_Match": f'"{TAG}"'}, PreconditionOutcome.PRECONDITION_FAILED),
        ({"If_Match": f'"{TAG}"', "If_None_Match": f'"{TAG}"'}, PreconditionOutcome.NOT_MODIFIED),
    ],
)
def test_preconditions_in_the_order_of_rfc_9110(fields: dict[str, str], outcome: PreconditionOutcome) -> None:
    assert VALIDATORS.evaluate(headers(**fields)) is outcome


@pytest.mark.parametrize(
    ("if_range", "applies"),
    [
        (None, True),
        (f'"{TAG}"', True),
        (f' "{TAG}" ', True),
        (f'W/"{TAG}"', False),
        ('"other"', False),
        (AT, True),
        (BEFORE, False),
        (AFTER, False),
        ("not a date", False),
        ("", False),
    ],
)
def test_if_range_needs_a_strong_match_or_the_exact_date(if_range: str | None, applies: bool) -> None:
    fields = {} if if_range is None else {"If_Range": if_range}
    assert VALIDATORS.range_applies(headers(**fields)) is applies


def repeated(*lines: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(lines))


@pytest.mark.parametrize(
    ("lines", "outcome"),
    [
        # Each line of a list field is part of one list (RFC 9110 section 5.3).
        ((("If-Match", '"x"'), ("If-Match", f'"{TAG}"')), PreconditionOutcome.PROCEED),
        ((("If-Match", f'"{TAG}"'), ("If-Match", '"x"')), PreconditionOutcome.PROCEED),
        ((("If-Match", '"x"'), ("If-Match", '"y"')), PreconditionOutcome.PRECONDITION_FAILED),
        ((("If-None-Match", '"x"'), ("If-None-Match", f'W/"{TAG}"')), PreconditionOutcome.NOT_MODIFIED),
        # A date field sent twice is invalid, so ignored, whichever of its dates would decide.
        ((("If-Unmodified-Since", AT), ("If-Unmodified-Since", BEFORE)), PreconditionOutcome.PROCEED),
        ((("If-Unmodified-Since", BEFORE), ("If-Unmodified-Since", AT)), PreconditionOutcome.PROCEED),
        ((("If-Modified-Since", AT), ("If-Modified-Since", AT)), PreconditionOutcome.PROCEED),
    ],
)
def test_repeated_fields(lines: tuple[tuple[str, str], ...], outcome: PreconditionOutcome) -> None:
    assert VALIDATORS.evaluate(repeated(*lines)) is outcome


@pytest.mark.parametrize(
    "field",
    [
        f'"x", , "{TAG}"',
        f', "{TAG}"',
        f'"{TAG}",',
        f'"x",,,"{TAG}"',
        f'"x" ,\t"{TAG}"',
    ],
)
def test_empty_list_elements_are_allowed(field: str) -> None:
    assert VALIDATORS.evaluate(headers(If_Match=field)) is PreconditionOutcome.PROCEED
    assert VALIDATORS.evaluate(headers(If_None_Match=field)) is PreconditionOutcome.NOT_MODIFIED


@pytest.mark.parametrize(
    "field",
    [f'"x" "{TAG}"', f'"x"; "{TAG}"', f"{TAG}", f'"x", {TAG}', f'w/"{TAG}"', f'"{TAG}"\n'],
)
def test_a_list_that_does_not_parse_matches_nothing(field: str) -> None:
    assert VALIDATORS.evaluate(headers(If_Match=field)) is PreconditionOutcome.PRECONDITION_FAILED


@pytest.mark.parametrize(
    "date",
    [
        AT,
        "Monday, 30-Nov-26 08:00:01 GMT",  # the obsolete RFC 850 form
        "Mon Nov 30 08:00:01 2026",  # asctime
    ],
)
def test_every_form_of_http_date(date: str) -> None:
    assert VALIDATORS.evaluate(headers(If_Modified_Since=date)) is PreconditionOutcome.NOT_MODIFIED
    assert VALIDATORS.range_applies(headers(If_Range=date)) is True


def test_asctime_single_digit_day() -> None:
    assert http_date("Sun Nov  6 08:49:37 1994") == datetime(1994, 11, 6, 8, 49, 37, tzinfo=UTC)


def test_rfc850_year_more_than_fifty_years_ahead_is_in_the_past() -> None:
    two_digits = (datetime.now(UTC).year + 60) % 100
    parsed = http_date(f"Sunday, 06-Nov-{two_digits:02d} 08:49:37 GMT")
    assert parsed is not None and parsed.year == datetime.now(UTC).year + 60 - 100


@pytest.mark.parametrize(
    "date",
    [
        # Out of range for a datetime, or not a real day or time.
        "Mon, 30 Nov 0000 08:00:01 GMT",
        "Mon, 31 Feb 2026 08:00:01 GMT",
        "Mon, 30 Nov 2026 24:00:01 GMT",
        "Mon, 30 Nov 99999 08:00:01 GMT",
        "Mon, 30 Nov 2026 08:00:01 +9999",
        # Forms that are not an HTTP-date: another zone, no weekday, lower case, two dates.
        "Mon, 30 Nov 2026 03:00:01 EST",
        "Mon, 30 Nov 2026 08:00:01 +0000",
        "30 Nov 2026 08:00:01 GMT",
        "mon, 30 nov 2026 08:00:01 gmt",
        f"{AT}, {AT}",
        f"{AT},",
        "",
    ],
)
def test_anything_but_one_http_date_is_ignored(date: str) -> None:
    assert http_date(date) is None
    assert VALIDATORS.evaluate(headers(If_Modified_Since=date)) is PreconditionOutcome.PROCEED
    assert VALIDATORS.evaluate(headers(If_Unmodified_Since=date.replace("2026", "2025"))) is PreconditionOutcome.PROCEED
    assert VALIDATORS.range_applies(headers(If_Range=date)) is False


@pytest.mark.parametrize(
    "lines",
    [
        (("If-Range", f'"{TAG}"'), ("If-Range", f'"{TAG}"')),
        (("If-Range", AT), ("If-Range", AT)),
    ],
)
def test_if_range_sent_twice_asks_for_the_whole_file(lines: tuple[tuple[str, str], ...]) -> None:
    assert VALIDATORS.range_applies(repeated(*lines)) is False
