"""Reading request header fields that may arrive more than once (RFC 9110 section 5.3)."""

from __future__ import annotations

from multidict import CIMultiDictProxy


class RepeatedField(ValueError):
    """A singleton field sent in more than one field line; ``name`` is the field's name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"several {name} fields")
        self.name = name


def field_list(headers: CIMultiDictProxy[str], name: str) -> str | None:
    """The field ``name`` as one comma-separated list, its lines joined in order as RFC 9110 section 5.3
    allows for a list-based field; None when absent.
    """
    lines = headers.getall(name, [])
    return ", ".join(lines) if lines else None


def only_field(headers: CIMultiDictProxy[str], name: str) -> str | None:
    """The value of the singleton field ``name``, None when absent. Raises ``RepeatedField`` when it is sent
    more than once: intermediaries disagree on which line counts (one keeps the first, another the last), so
    picking one would let a proxy and the service act on different values (docs/api.md: API reference,
    Authentication; docs/api.md: API reference, Idempotency-Key).
    """
    lines = headers.getall(name, [])
    if len(lines) > 1:
        raise RepeatedField(name)
    return lines[0] if lines else None


def sole_field(headers: CIMultiDictProxy[str], name: str) -> str | None:
    """``only_field`` for a singleton that a request may do without (``Range``, ``If-Range``, a date): sent
    more than once, it is invalid and so ignored (None), never one of its values picked.
    """
    try:
        return only_field(headers, name)
    except RepeatedField:
        return None
