"""The OpenAPI document keeps its meaning: against the committed baseline (``openapi_baseline.json``, the
document as it was before the code that builds it was reorganised), only descriptions and summaries may
differ, and the order of an ``enum``'s values (which means nothing in JSON Schema), and the additions named in
``ADDED``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.api.http.openapi import build_document
from services.api.views import schedules
from shared.routes import ROUTES_BY_NAME

BASELINE = Path(__file__).with_name("openapi_baseline.json")
PROSE = frozenset({"description", "summary"})
# (path of keys into the document, addition) that the document gained on purpose since the baseline. The
# addition is merged into what is there (``_add``), so an entry says only what is new.
DOWNLOADS = ("/v3/exports/{operation_id}/result", "/v3/exports/{operation_id}/result/parts/{number}")
_DELIVERY = {"enum": ["redirect", "stream"], "title": "Delivery", "type": "string"}
_DOWNLOAD_QUERY = {
    "additionalProperties": False,
    "properties": {"delivery": _DELIVERY},
    "title": "DownloadQuery",
    "type": "object",
}


# Export schedules (docs/api.md: Export schedules): their routes, models and tag are new as a whole, so they are
# taken from the document as it is built (the schedule API's tests hold what they mean); what existed gains
# only a run's schedule and due time in ``Operation``.
_DOCUMENT = build_document()
SCHEDULE_PATHS = sorted({ROUTES_BY_NAME[endpoint.route].path for endpoint in schedules.ENDPOINTS})
SCHEDULE_SCHEMAS = (
    "ExportScheduleSubmission",
    "PauseReason",
    "Schedule",
    "ScheduleLinks",
    "ScheduleMode",
    "ScheduleOptions",
    "SchedulePage",
    "SchedulePageQuery",
    "ScheduleRun",
    "ScheduleRunPage",
    "ScheduleState",
    "WaitingReason",
)
_TIMESTAMP = {
    "format": "date-time",
    "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z$",
    "type": "string",
}
_RUN_OF = {
    "properties": {
        "schedule_id": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Schedule Id"},
        "due_at": {"anyOf": [_TIMESTAMP, {"type": "null"}], "title": "Due At"},
    },
    "required": ["schedule_id", "due_at"],
}


OPERATION = "/v3/operations/{operation_id}"
_OPERATION_ETAG = {"required": True, "schema": {"type": "string", "pattern": '^W/"[0-9]+"$'}}
_RETRY_AFTER_REQUIRED = {"required": True, "schema": {"type": "integer", "minimum": 1}}
_IF_NONE_MATCH = {"name": "If-None-Match", "in": "header", "required": False, "schema": {"type": "string"}}
_NOT_MODIFIED = {
    "headers": {
        "Cache-Control": {"required": True, "schema": {"const": "no-store"}},
        "ETag": _OPERATION_ETAG,
        "Retry-After": {"required": False, "schema": {"type": "integer", "minimum": 1}},
    }
}


class Prepended(list[Any]):
    """An addition that goes before a list's items rather than after them."""


def _query_refused(method: str) -> dict[str, Any]:
    """The ``422 VALIDATION_FAILED`` of a route that refuses an unknown query parameter; a HEAD answer has no
    body, so its problem is bare.
    """
    problem = {"$ref": "#/components/schemas/Problem", "properties": {"code": {"enum": ["VALIDATION_FAILED"]}}}
    return {} if method == "head" else {"content": {"application/problem+json": {"schema": problem}}}


def _redirect_answers(method: str) -> dict[str, Any]:
    header = {"required": True, "schema": {"type": "string", "format": "uri"}}
    return {
        "parameters": Prepended([{"name": "delivery", "in": "query", "required": False, "schema": _DELIVERY}]),
        "responses": {
            "303": {
                "headers": {
                    "Location": header,
                    "Cache-Control": {"required": True, "schema": {"const": "no-store"}},
                    "Referrer-Policy": {"required": True, "schema": {"const": "no-referrer"}},
                }
            },
            "422": _query_refused(method),
        },
    }


ADDED: list[tuple[tuple[str, ...], Any]] = [
    # The representation says whether the operation is finished (docs/api.md: Operations, Operation).
    (
        ("components", "schemas", "Operation"),
        {"properties": {"done": {"title": "Done", "type": "boolean"}}, "required": ["done"]},
    ),
    # The plain-text format (docs/api.md: Submitting an export, Export options): its name, its content type, its file.
    (("components", "schemas", "ExportSubmission", "properties", "format", "enum"), ["txt"]),
    (("components", "schemas", "OperationRequest", "properties", "format", "enum"), ["txt"]),
    (("components", "schemas", "OperationResult", "properties", "content_type", "enum"), ["text/plain; charset=utf-8"]),
    *(
        (
            ("paths", path, "get", "responses", status, "content", "text/plain; charset=utf-8"),
            {"schema": {"type": "string"}},
        )
        for path in DOWNLOADS
        for status in ("200", "206")
    ),
    # Downloads by redirect (docs/api.md: Downloads, Download by redirect): the query, the 303, the 422.
    (("components", "schemas", "DownloadQuery"), _DOWNLOAD_QUERY),
    *((("paths", path, method), _redirect_answers(method)) for path in DOWNLOADS for method in ("get", "head")),
    # A 422 lists its first errors and counts them all (docs/api.md: Error codes, Validation problems).
    (
        ("components", "schemas", "Problem", "properties", "error_count"),
        {"minimum": 1, "title": "Error Count", "type": "integer"},
    ),
    # Every route that needs a token refuses an unknown query parameter (docs/api.md: API reference, Read).
    *(
        (("paths", path, method, "responses", "422"), _query_refused(method))
        for path, method in (
            ("/v2/conversations/{cid}/messages/{message_id}", "delete"),
            ("/v3/webhooks/secret", "get"),
            ("/v3/webhooks/secret", "head"),
        )
    ),
    (("components", "schemas", "Operation"), _RUN_OF),
    (("tags",), [{"name": "schedules"}]),
    *((("paths", path), _DOCUMENT["paths"][path]) for path in SCHEDULE_PATHS),
    *((("components", "schemas", name), _DOCUMENT["components"]["schemas"][name]) for name in SCHEDULE_SCHEMAS),
    # Conditional polls (docs/api.md: Operations, Conditional polls): the ETag of every operation answer,
    # If-None-Match and the 304 of the status monitor.
    *(
        (("paths", path, method, "responses", status, "headers", "ETag"), _OPERATION_ETAG)
        for path, method, status in (
            (OPERATION, "get", "200"),
            (OPERATION, "head", "200"),
            ("/v3/operations/{operation_id}/cancel", "post", "200"),
            ("/v3/operations/{operation_id}/cancel", "post", "202"),
            ("/v3/conversations/{cid}/exports", "post", "202"),
        )
    ),
    *((("paths", OPERATION, method, "parameters"), [_IF_NONE_MATCH]) for method in ("get", "head")),
    *((("paths", OPERATION, method, "responses", "304"), _NOT_MODIFIED) for method in ("get", "head")),
    # A 429 TOO_MANY_WAITERS carries its Retry-After, as every 429 does (docs/api.md: API reference).
    *(
        (("paths", path, method, "responses", "429", "headers"), {"Retry-After": _RETRY_AFTER_REQUIRED})
        for path, method in ((OPERATION, "get"), (OPERATION, "head"), (f"{OPERATION}/events", "get"))
    ),
]


def _without_prose(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _meaning(key, value) for key, value in node.items() if key not in PROSE}
    if isinstance(node, list):
        return [_without_prose(item) for item in node]
    return node


def _meaning(key: str, value: Any) -> Any:
    """A member's value as the comparison sees it: an ``enum``'s values as a sorted list, anything else
    ``_without_prose``.
    """
    if key == "enum" and isinstance(value, list):
        return sorted(value, key=json.dumps)
    return _without_prose(value)


def _add(node: Any, addition: Any) -> Any:
    """``node`` with ``addition`` merged in: an object member by member, a list extended at its end (at its
    start for ``Prepended``); anything
    else (or nothing) is replaced by ``addition``.
    """
    if isinstance(node, dict) and isinstance(addition, dict):
        return {**node, **{key: _add(node.get(key), value) for key, value in addition.items()}}
    if isinstance(node, list) and isinstance(addition, Prepended):
        return [*addition, *node]
    if isinstance(node, list) and isinstance(addition, list):
        return [*node, *addition]
    return addition


def _baseline_with_additions() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(BASELINE.read_text())
    for keys, addition in ADDED:
        *parents, last = keys
        node = document
        for key in parents:
            node = node[key]
        node[last] = _add(node.get(last), addition)
    return document


def test_the_document_means_what_the_baseline_means() -> None:
    document = build_document()
    document["info"]["version"] = "baseline"
    assert _without_prose(document) == _without_prose(_baseline_with_additions())


def test_prose_is_all_the_comparison_leaves_out() -> None:
    changed = _baseline_with_additions()
    changed["paths"]["/v3/operations/{operation_id}"]["get"]["operationId"] = "renamed"
    assert _without_prose(changed) != _without_prose(json.loads(BASELINE.read_text()))
