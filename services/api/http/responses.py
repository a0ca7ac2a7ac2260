"""JSON success responses, the one module views take them from: UTF-8 text as is, so the read API prints a
body exactly as the export file does, and the status monitor's headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from aiohttp import web

from services.api.http.contract import NO_STORE_HEADER, OPERATION_ETAG_HEADER, Answer
from services.api.http.schemas import Operation
from shared import jsontext
from shared.recent import RecentlyUsed, built_for, kept_for
from shared.repository.operation_view import OPERATIONS_KEPT, OperationView, Stamped
from shared.representation import is_terminal, next_poll_after_seconds, represent


def dumps(body: Any) -> str:
    """Serialise ``body`` as JSON: non-ASCII as is, line-breaking code points escaped (``shared.jsontext``)."""
    return jsontext.dumps(body)


NO_STORE = {"Cache-Control": "no-store"}

# (operation_id, version, next_poll_after_seconds or None when terminal) -> the operation's created_at
# (``built_for``'s stamp), and the JSON text and its UTF-8 bytes.
_renderings: RecentlyUsed[tuple[str, int, int | None], tuple[datetime, tuple[str, bytes]]] = RecentlyUsed(
    OPERATIONS_KEPT
)
_JSON_CONTENT_TYPE = {"Content-Type": "application/json; charset=utf-8"}


def _key(row: Stamped) -> tuple[str, int, int | None]:
    """The key of ``row``'s rendering: its id, version and ``next_poll_after_seconds`` (None when terminal)."""
    return row.operation_id, row.version, None if is_terminal(row) else next_poll_after_seconds(row.age_seconds)


def _rendering(row: OperationView) -> tuple[str, bytes]:
    """``row``'s representation as JSON text and bytes, built once per operation, version and
    ``next_poll_after_seconds``: every field of the representation bumps the version but that one, which grows
    with the operation's age (docs/api.md: Operations, Conditional polls), so the three name one text. The
    last ``OPERATIONS_KEPT`` are kept, least recently used first out.
    """
    return built_for(_renderings, _key(row), row.created_at, lambda: _encoded(dumps(represent(row))))


def _encoded(text: str) -> tuple[str, bytes]:
    return text, text.encode()


def rendered_operation(row: OperationView) -> str:
    """``row``'s representation as JSON text (``_rendering``): polls of one version and the waiters woken by
    one change share it."""
    return _rendering(row)[0]


def operation_etag(row: Stamped) -> str:
    """The operation's weak ``ETag``, ``W/"<version>"`` (docs/api.md: Operations, Conditional polls): every
    field of the representation bumps the version, but ``next_poll_after_seconds`` grows with age at one
    version, so the tag is weak (RFC 9110 section 8.8.1).
    """
    return f'W/"{row.version}"'


def operation_response(
    row: OperationView, *, status: int = 200, poll_after_seconds: int | None = None, **headers: str
) -> web.Response:
    """The operation as JSON with the status monitor's headers (``_monitor_headers``); ``poll_after_seconds``
    replaces the representation's ``next_poll_after_seconds`` as ``Retry-After``.
    """
    return _operation_response(row, _rendering(row)[1], status, poll_after_seconds, headers)


def kept_operation_response(stamp: Stamped) -> web.Response | None:
    """``operation_response`` of the representation ``stamp`` names, from the rendering this process keeps of it;
    None when it keeps none (docs/benchmark.md: The poll's own work).
    """
    kept = kept_for(_renderings, _key(stamp), stamp.created_at)
    return None if kept is None else _operation_response(stamp, kept[1], 200, None, {})


def _operation_response(
    row: Stamped, body: bytes, status: int, poll_after_seconds: int | None, headers: Mapping[str, str]
) -> web.Response:
    poll_after = next_poll_after_seconds(row.age_seconds) if poll_after_seconds is None else poll_after_seconds
    # The body as bytes with its Content-Type among the headers: aiohttp then neither encodes nor parses it.
    return web.Response(
        body=body, status=status, headers={**_JSON_CONTENT_TYPE, **_monitor_headers(row, poll_after), **headers}
    )


def operation_not_modified(row: Stamped) -> web.Response:
    """``304 Not Modified`` for the operation: no body, the headers its 200 would carry (RFC 9110 section 15.4.5)."""
    return web.Response(status=304, headers=_monitor_headers(row, next_poll_after_seconds(row.age_seconds)))


def _monitor_headers(row: Stamped, poll_after_seconds: int | None) -> dict[str, str]:
    """no-store, the weak ``ETag``, and while the operation is not terminal ``Retry-After``."""
    headers = {**NO_STORE, "ETag": operation_etag(row)}
    if not is_terminal(row) and poll_after_seconds is not None:
        headers["Retry-After"] = str(poll_after_seconds)
    return headers


def operation_answer(status: int, description: str, headers: Mapping[str, Any] | None = None) -> Answer:
    """The contract of an ``operation_response`` of ``status``: an ``Operation`` with ``no-store``, its ``ETag``
    and ``headers`` (``services.api.http.contract.header`` objects by name).
    """
    return Answer(
        status,
        description,
        Operation,
        headers={"Cache-Control": NO_STORE_HEADER, "ETag": OPERATION_ETAG_HEADER, **(headers or {})},
    )


def json_response(body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """A ``200`` (or ``status``) ``application/json`` response of ``body``."""
    return web.json_response(body, status=status, headers=headers, dumps=dumps)
