"""Keyset pages: of operations, newest first, shared by the user's list (``GET /v3/operations``) and the admin
list (``GET /admin/operations``) (docs/api.md: Operations, List); of export schedules and of a schedule's runs,
newest first (docs/api.md: Export schedules); and of the caller's conversations, by id (``GET /v2/conversations``).

A page is read with one row more than asked: that row only tells whether another page follows. The cursor
names the last row shown by the key its list is ordered by, a time and an id (an operation's ``(created_at,
operation_id)``, a schedule's ``(created_at, schedule_id)``, a run's ``(due_at, operation_id)``), so the next
page starts strictly after it whatever was inserted meanwhile.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from aiohttp.typedefs import Handler
from pydantic import BaseModel

from services.api.http.contract import NO_STORE_HEADER, Answer, Endpoint
from services.api.http.problems import ProblemError, validation_failed
from shared.ids import is_operation_id, is_valid_id
from shared.repository.operation_view import OperationView
from shared.timefmt import MAX_YEAR, MIN_YEAR

# Where the list's cursor and the last row of a page come from: (a time, an id), as the list is ordered.
Keyset = tuple[datetime, str]
Row = TypeVar("Row")


def page_endpoint(
    route: str,
    handler: Handler,
    summary: str,
    *,
    tag: str,
    query: type[BaseModel],
    page: type[BaseModel],
    problems: tuple[str, ...] = (),
) -> Endpoint:
    """The contract of a GET of one keyset page: its ``query`` model's parameters, the ``page`` model with
    ``no-store``, and a 422 for a bad cursor or parameter, besides ``problems``.
    """
    return Endpoint(
        route=route,
        handler=handler,
        summary=summary,
        tag=tag,
        description="`cursor` is a `next_cursor` passed back as it is; anything else is a 422.",
        query=query,
        answers=(Answer(200, "One page.", page, headers={"Cache-Control": NO_STORE_HEADER}),),
        problems=("VALIDATION_FAILED", *problems),
    )


def split_page(rows: list[OperationView], *, limit: int) -> tuple[list[OperationView], str | None]:
    """``rows`` of operations by creation, read with ``limit + 1``, as (the page of at most ``limit`` rows, the
    next page's cursor or None on the last page).
    """
    return split_keyset_page(rows, limit=limit, keyset=lambda row: (row.created_at, row.operation_id))


def split_keyset_page(rows: list[Row], *, limit: int, keyset: Callable[[Row], Keyset]) -> tuple[list[Row], str | None]:
    """``split_page`` for rows of any list, ``keyset`` giving the key a row is ordered by."""
    page = rows[:limit]
    return page, encode_keyset(keyset(page[-1])) if len(rows) > limit else None


def encode_keyset(keyset: Keyset) -> str:
    """The opaque cursor after the row of ``keyset``: unpadded URL-safe base64 of ``[time ISO 8601, id]``."""
    at, key = keyset
    raw = json.dumps([at.isoformat(), key]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def encode_conversation_cursor(conversation_id: str) -> str:
    """The opaque cursor after the conversation ``conversation_id``: unpadded URL-safe base64 of the id."""
    return base64.urlsafe_b64encode(conversation_id.encode()).decode().rstrip("=")


def decode_conversation_cursor(cursor: str | None) -> str | None:
    """The conversation id a cursor of ``encode_conversation_cursor`` names; None without a cursor. Raises
    ``ProblemError`` 422 at ``["query", "cursor"]`` for anything else.
    """
    if cursor is None:
        return None
    try:
        conversation_id = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, ValueError):
        conversation_id = ""
    if not is_valid_id(conversation_id):
        raise _not_a_cursor()
    return conversation_id


def _not_a_cursor() -> ProblemError:
    return validation_failed([{"loc": ["query", "cursor"], "msg": "Not a cursor from this API"}])


def decode_cursor(cursor: str | None) -> Keyset | None:
    """The keyset a cursor of ``encode_keyset`` names; None without a cursor. Anything that does not decode
    to a zoned time (years 1000-9999) and an id with an operation id's syntax (a schedule's has it too)
    raises ``ProblemError`` 422 at ``["query", "cursor"]``.
    """
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, operation_id = json.loads(raw)
        if not (isinstance(operation_id, str) and is_operation_id(operation_id)):
            raise ValueError("not an operation id")
        created_at = datetime.fromisoformat(created)
        if created_at.tzinfo is None or not MIN_YEAR <= created_at.astimezone(UTC).year <= MAX_YEAR:
            raise ValueError("not a creation time")
        return created_at, operation_id
    except (binascii.Error, ValueError, TypeError, OverflowError, RecursionError):
        raise _not_a_cursor() from None
