"""The ``Idempotency-Key`` header (docs/api.md: Submitting an export, Submit)."""

from __future__ import annotations

import re

from multidict import CIMultiDictProxy

from services.api.http.fields import RepeatedField, only_field
from services.api.http.problems import ProblemError

HEADER = "Idempotency-Key"
# What parse_idempotency_key raises, for the declaration of a route that reads the header.
KEY_PROBLEMS = ("IDEMPOTENCY_KEY_MISSING", "IDEMPOTENCY_KEY_INVALID")
_VISIBLE = re.compile(r"[\x21-\x7e]{1,255}")
# RFC 8941 sf-string: printable ASCII, with only \" and \\ as escapes.
_SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
_SF_ESCAPE = re.compile(r"\\([\"\\])")


def parse_idempotency_key(headers: CIMultiDictProxy[str]) -> str:
    """Return the key of the request's ``headers``: 1-255 visible ASCII characters (0x21-0x7E), unquoted if
    sent as an RFC 8941 string.

    Raises ``ProblemError`` IDEMPOTENCY_KEY_MISSING when absent, IDEMPOTENCY_KEY_INVALID otherwise: an empty
    value is present but breaks the 1-255 rule, like ``""``. The unquoted key must itself be visible ASCII,
    so ``" a"`` (with a space) is invalid. Two or more fields are IDEMPOTENCY_KEY_INVALID whatever their
    values, as two ``Authorization`` fields are refused: a proxy that keeps the last one would deduplicate on
    another key than the service (docs/api.md: API reference, Idempotency-Key).
    """
    try:
        value = only_field(headers, HEADER)
    except RepeatedField:
        raise ProblemError("IDEMPOTENCY_KEY_INVALID", f"Send one {HEADER} field, not several.") from None
    if value is None:
        raise ProblemError("IDEMPOTENCY_KEY_MISSING", f"Send an {HEADER} header to make the submission safe to retry.")
    quoted = _SF_STRING.fullmatch(value)
    key = _SF_ESCAPE.sub(r"\1", quoted.group(1)) if quoted else value
    if (value.startswith('"') and not quoted) or not _VISIBLE.fullmatch(key):
        raise ProblemError(
            "IDEMPOTENCY_KEY_INVALID",
            f"The {HEADER} must be 1-255 visible ASCII characters (0x21-0x7E), optionally in double quotes.",
        )
    return key
