"""JSON success responses, the one module views take them from: UTF-8 text as is, so the read API prints a
body exactly as the export file does, and the status monitor's headers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from services.api.http.contract import NO_STORE_HEADER, OPERATION_ETAG_HEADER, Answer
from services.api.http.schemas import Operation
from shared import jsontext
from shared.repository.operation_view import OperationView
from shared.representation import is_terminal, next_poll_after_seconds, represent


def dumps(body: Any) -> str:
    """Serialise ``body`` as JSON: non-ASCII as is, line-breaking code points escaped (``shared.jsontext``)."""
    return jsontext.dumps(body)


NO_STORE = {"Cache-Control": "no-store"}

# How many of the last rendered rows keep their JSON text: enough for every operation changing at once.
_RENDERINGS_KEPT = 256
_renderings: OrderedDict[int, tuple[OperationView, str]] = OrderedDict()


def rendered_operation(row: OperationView) -> str:
    """``row``'s representation as JSON text, built once per row object: the waiters woken by one change share
    one read, so one row (``OperationChanges.read``), and a row is immutable, its age included, so its text
    never changes. The last ``_RENDERINGS_KEPT`` rows are kept, each with its row so that its id cannot be
    reused meanwhile.
    """
    kept = _renderings.get(id(row))
    if kept is not None and kept[0] is row:
        return kept[1]
    text = dumps(represent(row))
    _renderings[id(row)] = (row, text)
    if len(_renderings) > _RENDERINGS_KEPT:
        _renderings.popitem(last=False)
    return text


def operation_etag(row: OperationView) -> str:
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
    poll_after = next_poll_after_seconds(row.age_seconds) if poll_after_seconds is None else poll_after_seconds
    return web.Response(
        text=rendered_operation(row),
        status=status,
        content_type="application/json",
        headers={**_monitor_headers(row, poll_after), **headers},
    )


def operation_not_modified(row: OperationView) -> web.Response:
    """``304 Not Modified`` for the operation: no body, the headers its 200 would carry (RFC 9110 section 15.4.5)."""
    return web.Response(status=304, headers=_monitor_headers(row, next_poll_after_seconds(row.age_seconds)))


def _monitor_headers(row: OperationView, poll_after_seconds: int | None) -> dict[str, str]:
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
