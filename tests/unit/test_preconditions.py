"""Preconditions of a result download (RFC 9110 section 13): order of evaluation, strong and weak
comparison, HTTP-dates at one-second precision, and If-Range.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from services.api.preconditions import Outcome, Validators

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
        ({}, Outcome.PROCEED),
        ({"If_Match": f'"{TAG}"'}, Outcome.PROCEED),
        ({"If_Match": f'"x", "{TAG}"'}, Outcome.PROCEED),
        ({"If_Match": "*"}, Outcome.PROCEED),
        ({"If_Match": f'W/"{TAG}"'}, Outcome.PRECONDITION_FAILED),
        ({"If_Match": '"other"'}, Outcome.PRECONDITION_FAILED),
        ({"If_Match": "not a tag"}, Outcome.PRECONDITION_FAILED),
        ({"If_Unmodified_Since": AT}, Outcome.PROCEED),
        ({"If_Unmodified_Since": AFTER}, Outcome.PROCEED),
        ({"If_Unmodified_Since": BEFORE}, Outcome.PRECONDITION_FAILED),
        ({"If_Unmodified_Since": "yesterday"}, Outcome.PROCEED),
        # If-Match present: If-Unmodified-Since is not evaluated (13.2.2 step 2).
        ({"If_Match": f'"{TAG}"', "If_Unmodified_Since": BEFORE}, Outcome.PROCEED),
        ({"If_None_Match": f'"{TAG}"'}, Outcome.NOT_MODIFIED),
        ({"If_None_Match": f'W/"{TAG}"'}, Outcome.NOT_MODIFIED),
        ({"If_None_Match": f'"a", W/"{TAG}"'}, Outcome.NOT_MODIFIED),
        ({"If_None_Match": "*"}, Outcome.NOT_MODIFIED),
        ({"If_None_Match": '"other"'}, Outcome.PROCEED),
        ({"If_Modified_Since": AT}, Outcome.NOT_MODIFIED),
        ({"If_Modified_Since": AFTER}, Outcome.NOT_MODIFIED),
        ({"If_Modified_Since": BEFORE}, Outcome.PROCEED),
        ({"If_Modified_Since": "garbage"}, Outcome.PROCEED),
        # If-None-Match present: If-Modified-Since is not evaluated (step 4).
        ({"If_None_Match": '"other"', "If_Modified_Since": AFTER}, Outcome.PROCEED),
        # If-Match fails first, whatever If-None-Match says (step 1 before step 3).
        ({"If_Match": '"other"', "If_None_Match": f'"{TAG}"'}, Outcome.PRECONDITION_FAILED),
        ({"If_Unmodified_Since": BEFORE, "If_None_Match": f'"{TAG}"'}, Outcome.PRECONDITION_FAILED),
        ({"If_Match": f'"{TAG}"', "If_None_Match": f'"{TAG}"'}, Outcome.NOT_MODIFIED),
    ],
)
def test_preconditions_in_the_order_of_rfc_9110(fields: dict[str, str], outcome: Outcome) -> None:
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
    assert VALIDATORS.range_applies(if_range) is applies
