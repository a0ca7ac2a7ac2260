"""Identifiers: operation ids and the syntax of user, conversation and message ids."""

from __future__ import annotations

import re
import secrets

# User ids (docs/api.md: Tokens and keys, Authentication) are 1-64 chars of [A-Za-z0-9_.:-]; the same rule serves
# conversation ids.
ID_PATTERN = r"[A-Za-z0-9_.:-]{1,64}"
_ID_RE = re.compile(ID_PATTERN)
# Operation ids (docs/api.md: Operations, Operation) are URL-safe and at most 64 chars; anything else in a path names
# no operation.
OPERATION_ID_PATTERN = r"[A-Za-z0-9_-]{1,64}"
_OPERATION_ID_RE = re.compile(OPERATION_ID_PATTERN)


def new_operation_id() -> str:
    """Return an opaque, URL-safe id with 144 bits from the CSPRNG (docs/api.md: Operations, Operation: at least
    96)."""
    return "op_" + secrets.token_urlsafe(18)


def new_schedule_id() -> str:
    """Return a schedule's id: opaque and URL-safe like an operation's, 144 bits from the CSPRNG (docs/schedules.md:
    The resource)."""
    return "sch_" + secrets.token_urlsafe(18)


def new_attachment_id() -> str:
    """Return an attachment's id: opaque and URL-safe like an operation's, 144 bits from the CSPRNG, so that
    it never collides and, as a folder name in a ZIP, never needs making safe (docs/api.md: Message store,
    Attachments)."""
    return "att_" + secrets.token_urlsafe(18)


def is_operation_id(value: str) -> bool:
    """True when ``value`` could be an operation id; looking up anything else is pointless (and a U+0000
    in it would even fail in Postgres).
    """
    return _OPERATION_ID_RE.fullmatch(value) is not None


def is_valid_id(value: str) -> bool:
    """True when ``value`` is a well-formed user or conversation id."""
    return _ID_RE.fullmatch(value) is not None
