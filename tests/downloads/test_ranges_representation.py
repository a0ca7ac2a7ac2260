"""Download ranges (RFC 9110) and the operation representation's polling hint."""

from __future__ import annotations

import pytest

from services.api.http.ranges import ByteRange, RangeNotSatisfiable, parse_range
from shared.representation import next_poll_after_seconds


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=0-9", ByteRange(0, 9, 100)),
        ("bytes=90-200", ByteRange(90, 99, 100)),
        ("bytes=10-", ByteRange(10, 99, 100)),
        ("bytes=-5", ByteRange(95, 99, 100)),
        ("bytes=-500", ByteRange(0, 99, 100)),
        (None, None),
        ("bytes=0-1,5-6", None),
        ("items=0-1", None),
        ("bytes=-", None),
        ("bytes=9-3", None),
        ("bytes=a-b", None),
        ("bytes=\u0661-\u0662", None),
        ("bytes=0-" + "9" * 5000, ByteRange(0, 99, 100)),
        ("bytes=-" + "9" * 5000, ByteRange(0, 99, 100)),
    ],
)
def test_parse_range(header: str | None, expected: ByteRange | None) -> None:
    assert parse_range(header, 100) == expected


@pytest.mark.parametrize(
    ("header", "size"),
    [("bytes=100-", 100), ("bytes=-0", 100), ("bytes=0-", 0), ("bytes=-3", 0), ("bytes=" + "9" * 5000 + "-", 100)],
)
def test_unsatisfiable_ranges(header: str, size: int) -> None:
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, size)


def test_byte_range_headers() -> None:
    byte_range = ByteRange(10, 19, 100)
    assert byte_range.length == 10
    assert byte_range.content_range() == "bytes 10-19/100"
    assert byte_range.s3_range() == "bytes=10-19"


def test_poll_interval_grows_with_age_between_1_and_30() -> None:
    hints = [next_poll_after_seconds(age) for age in (0, 0.5, 5, 10, 11, 60, 299, 301, 10_000)]
    assert hints == [1, 1, 1, 1, 2, 6, 30, 30, 30]
    assert hints == sorted(hints)
