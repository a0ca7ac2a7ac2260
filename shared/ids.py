"""Identifiers: operation ids and the syntax of user, conversation and message ids."""

from __future__ import annotations

import re
import secrets

# Contract 2: user ids are 1-64 chars of [A-Za-z0-9_.:-]; the same rule serves conversation ids.
ID_PATTERN = r"[A-Za-z0-9_.:-]{1,64}"
_ID_RE = re.compile(ID_PATTERN)


def new_operation_id() -> str:
    """Return an opaque, URL-safe id with 144 bits from the CSPRNG (contract 5.2: at least 96)."""
    return "op_" + secrets.token_urlsafe(18)


def is_valid_id(value: str) -> bool:
    """True when ``value`` is a well-formed user or conversation id."""
    return _ID_RE.fullmatch(value) is not None
