"""Reading request header fields that may arrive more than once (RFC 9110 section 5.3)."""

from __future__ import annotations

from multidict import CIMultiDictProxy


def field_list(headers: CIMultiDictProxy[str], name: str) -> str | None:
    """The field ``name`` as one comma-separated list, its lines joined in order as RFC 9110 section 5.3
    allows for a list-based field; None when absent.
    """
    lines = headers.getall(name, [])
    return ", ".join(lines) if lines else None


def sole_field(headers: CIMultiDictProxy[str], name: str) -> str | None:
    """The value of the singleton field ``name``, or None when absent or sent more than once: a repeated
    singleton (two ``Range``\\ s, two ``If-Range``\\ s, two dates) is invalid and so ignored, never one
    of its values picked.
    """
    lines = headers.getall(name, [])
    return lines[0] if len(lines) == 1 else None
