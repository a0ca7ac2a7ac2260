"""JSON success responses, the one module views take them from: UTF-8 text as is, so the read API prints a
body exactly as the export file does, and the status monitor's headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from services.api.http.contract import NO_STORE_HEADER, Answer
from services.api.http.schemas import Operation
from shared import jsontext
from shared.repository.operation_view import OperationView
from shared.representation import is_terminal, represent


def dumps(body: Any) -> str:
    """Serialise ``body`` as JSON: non-ASCII as is, line-breaking code points escaped (``shared.jsontext``)."""
    return jsontext.dumps(body)


NO_STORE = {"Cache-Control": "no-store"}


def operation_response(
    row: OperationView, *, status: int = 200, poll_after_seconds: int | None = None, **headers: str
) -> web.Response:
    """The operation as JSON with the status monitor's headers: no-store, and while it is not terminal
    ``Retry-After``, ``poll_after_seconds`` or else the representation's ``next_poll_after_seconds``.
    """
    body = represent(row)
    all_headers = {**NO_STORE, **headers}
    if not is_terminal(row):
        poll_after = body["next_poll_after_seconds"] if poll_after_seconds is None else poll_after_seconds
        all_headers["Retry-After"] = str(poll_after)
    return json_response(body, status=status, headers=all_headers)


def operation_answer(status: int, description: str, headers: Mapping[str, Any] | None = None) -> Answer:
    """The contract of an ``operation_response`` of ``status``: an ``Operation`` with ``no-store`` and ``headers``
    (``services.api.http.contract.header`` objects by name).
    """
    return Answer(status, description, Operation, headers={"Cache-Control": NO_STORE_HEADER, **(headers or {})})


def json_response(body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """A ``200`` (or ``status``) ``application/json`` response of ``body``."""
    return web.json_response(body, status=status, headers=headers, dumps=dumps)
