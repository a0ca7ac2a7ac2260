"""How the API answers HTTP-level faults (docs/api.md: API reference): the problem for each parser error, and the
one way every route reads a body, so that none escapes the content-coding check and the body deadline.
``tests/http/test_http_faults.py`` sends the faults to the real server.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadHttpMethod,
    BadStatusLine,
    ContentEncodingError,
    HttpProcessingError,
    InvalidHeader,
    LineTooLong,
    TransferEncodingError,
)

from services.api.http.server import parser_problem

VIEWS = Path(__file__).resolve().parents[2] / "services" / "api" / "views"
SECRET = "Bearer SECRET-do-not-echo"


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (LineTooLong(SECRET.encode() * 10, 8190), 431, "REQUEST_HEADER_TOO_LARGE"),
        (ContentEncodingError(f"Can not decode content-encoding: br {SECRET}"), 415, "UNSUPPORTED_CONTENT_ENCODING"),
        (BadStatusLine(f"GARBAGE {SECRET} HTTP/1.1"), 400, "MALFORMED_REQUEST"),
        (BadHttpMethod(f"\x16\x03{SECRET}"), 400, "MALFORMED_REQUEST"),
        (InvalidHeader(f"X Bad {SECRET}".encode()), 400, "MALFORMED_REQUEST"),
        (TransferEncodingError(f"zz{SECRET}"), 400, "MALFORMED_REQUEST"),
        (BadHttpMessage("Too many headers received"), 400, "MALFORMED_REQUEST"),
        (HttpProcessingError(code=400, message=SECRET), 400, "MALFORMED_REQUEST"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_each_parser_error_has_its_problem_and_quotes_nothing(
    error: HttpProcessingError, status: int, code: str
) -> None:
    problem = parser_problem(error, max_line_bytes=8190)
    assert (problem.status, problem.code) == (status, code)
    response = problem.response()
    assert response.content_type == "application/problem+json"
    assert isinstance(response.body, bytes) and b"SECRET" not in response.body
    if code == "UNSUPPORTED_CONTENT_ENCODING":
        assert response.headers["Accept-Encoding"] == "identity"


# Ways of reading a request body other than ``services.api.http.bodies.read_limited``.
DIRECT_READS = re.compile(r"request\.(content\b|read\(|json\(|text\(|post\(|multipart\(|release\()")


@pytest.mark.parametrize("view", sorted(VIEWS.glob("*.py")), ids=lambda path: path.name)
def test_views_read_bodies_only_through_the_body_reader(view: Path) -> None:
    assert DIRECT_READS.findall(view.read_text(encoding="utf-8")) == []
