"""The OpenAPI 3.1 document of the public API (``/v2`` and ``/v3``), served at ``GET /v3/openapi.json``.

Component schemas are generated from the pydantic models of ``services.api.schemas``, so a change to a model
changes the document. Each route lists the problem codes (``services.api.problems.CODES``) it can answer;
they are grouped by status into ``application/problem+json`` responses whose ``code`` is limited to them.
The admin routes are operator tooling and are not part of this document.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
from collections import defaultdict
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from services.api import schemas
from services.api.idempotency import HEADER as IDEMPOTENCY_HEADER
from services.api.problems import CODES, PROBLEM_CONTENT_TYPE
from shared.formats import GZIP_CONTENT_TYPE
from shared.ids import ID_PATTERN, OPERATION_ID_PATTERN
from shared.representation import EVENT_STREAM
from shared.settings import Settings

OPENAPI_PATH = "/v3/openapi.json"
EVENTS_PATH = "/v3/operations/{operation_id}/events"
REF_TEMPLATE = "#/components/schemas/{model}"
JSON_MEDIA_TYPE = "application/json"

# (model, pydantic JSON schema mode): requests are described as validated, responses as serialised.
MODELS: tuple[tuple[type[BaseModel], Literal["validation", "serialization"]], ...] = (
    (schemas.MessageSubmission, "validation"),
    (schemas.MessagePageQuery, "validation"),
    (schemas.ExportSubmission, "validation"),
    (schemas.EmptyRequest, "validation"),
    (schemas.OperationListQuery, "validation"),
    (schemas.ConversationListQuery, "validation"),
    (schemas.OperationQuery, "validation"),
    (schemas.Problem, "serialization"),
    (schemas.StoredMessage, "serialization"),
    (schemas.MessagePage, "serialization"),
    (schemas.RecalledMessage, "serialization"),
    (schemas.Operation, "serialization"),
    (schemas.OperationPage, "serialization"),
    (schemas.ConversationPage, "serialization"),
    (schemas.WebhookSecret, "serialization"),
)

# Problems any authenticated route can answer: a bad token, a busy database, an internal fault (README: Error codes),
# and a request that breaks HTTP itself, which the HTTP server answers before any route (services.api.server).
ALWAYS = (
    "UNAUTHENTICATED",
    "SERVICE_UNAVAILABLE",
    "INTERNAL",
    "MALFORMED_REQUEST",
    "REQUEST_HEADER_TOO_LARGE",
    "EXPECTATION_FAILED",
)
# Problems of reading a JSON body, in the order they are checked (services.api.bodies).
JSON_BODY = (
    "UNSUPPORTED_MEDIA_TYPE",
    "UNSUPPORTED_CONTENT_ENCODING",
    "PAYLOAD_TOO_LARGE",
    "REQUEST_TIMEOUT",
    "MALFORMED_JSON",
    "VALIDATION_FAILED",
)


def _header(description: str, schema: dict[str, Any], *, required: bool = False) -> dict[str, Any]:
    return {"description": description, "required": required, "schema": schema}


NO_STORE = _header("Operation state changes: never cache.", {"const": "no-store"}, required=True)
OPERATION_LOCATION = _header(
    "The operation's status monitor.",
    {"type": "string", "pattern": f"^/v3/operations/{OPERATION_ID_PATTERN}$"},
    required=True,
)


def _retry_after(description: str, *, required: bool) -> dict[str, Any]:
    return _header(description, {"type": "integer", "minimum": 1}, required=required)


# Headers that come with a problem code wherever it is answered.
PROBLEM_HEADERS: dict[str, dict[str, dict[str, Any]]] = {
    "UNAUTHENTICATED": {
        "WWW-Authenticate": _header(
            'RFC 6750 challenge; `error_description` is "expired" only for a genuine token past its `exp`.',
            {"enum": [f'Bearer error="invalid_token", error_description="{why}"' for why in ("invalid", "expired")]},
            required=True,
        )
    },
    "UNSUPPORTED_CONTENT_ENCODING": {
        "Accept-Encoding": _header(
            "With `UNSUPPORTED_CONTENT_ENCODING`: the only coding accepted.", {"const": "identity"}
        )
    },
    "TOO_MANY_ACTIVE_EXPORTS": {"Retry-After": _retry_after("Seconds before trying again.", required=True)},
    "TOO_MANY_DOWNLOADS": {"Retry-After": _retry_after("Seconds before trying again.", required=True)},
    "SERVICE_UNAVAILABLE": {"Retry-After": _retry_after("Seconds before trying again.", required=True)},
    "RANGE_NOT_SATISFIABLE": {
        "Content-Range": _header("The file's size.", {"type": "string", "pattern": "^bytes \\*/[0-9]+$"}, required=True)
    },
}


def ref(model: type[BaseModel]) -> dict[str, str]:
    """A JSON reference to the component schema of ``model``."""
    return {"$ref": REF_TEMPLATE.format(model=model.__name__)}


def component_schemas() -> dict[str, Any]:
    """The component schemas of ``MODELS`` and of every model or enum they use, keyed by class name."""
    _, definitions = models_json_schema(MODELS, ref_template=REF_TEMPLATE)
    return dict(sorted(definitions["$defs"].items()))


def _json_response(description: str, model: type[BaseModel], **headers: dict[str, Any]) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": {JSON_MEDIA_TYPE: {"schema": ref(model)}}}
    if headers:
        response["headers"] = headers
    return response


def problem_responses(codes: tuple[str, ...]) -> dict[str, Any]:
    """One problem+json response per status of ``codes``, its ``code`` member limited to those codes."""
    by_status: dict[int, list[str]] = defaultdict(list)
    for code in codes:
        by_status[CODES[code][0]].append(code)
    return {str(status): _problem_response(status_codes) for status, status_codes in sorted(by_status.items())}


def _problem_response(codes: list[str]) -> dict[str, Any]:
    schema = {**ref(schemas.Problem), "properties": {"code": {"enum": codes}}}
    response: dict[str, Any] = {
        "description": "; ".join(f"`{code}`: {CODES[code][1]}" for code in codes),
        "content": {PROBLEM_CONTENT_TYPE: {"schema": schema}},
    }
    headers = {name: header for code in codes for name, header in PROBLEM_HEADERS.get(code, {}).items()}
    if headers:
        response["headers"] = headers
    return response


def _path_parameter(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "description": description, "schema": schema}


CID = _path_parameter(
    "cid",
    {"type": "string", "pattern": f"^{ID_PATTERN}$"},
    "Conversation id. One that breaks this syntax cannot exist: the same 404 as a missing conversation.",
)
OPERATION_ID = _path_parameter(
    "operation_id",
    {"type": "string", "pattern": f"^{OPERATION_ID_PATTERN}$"},
    "Operation id, as in `Location`. An id that is not the caller's answers the same 404 as a missing one.",
)
PART_NUMBER = _path_parameter(
    "number", {"type": "string", "pattern": "^[1-9][0-9]*$"}, "A part's `number` from `result.parts` (1-based)."
)
MESSAGE_ID = _path_parameter("message_id", {"type": "string", "minLength": 1, "maxLength": 64}, "Message id.")


def query_parameters(model: type[BaseModel], components: dict[str, Any]) -> list[dict[str, Any]]:
    """The fields of a query model as OpenAPI query parameters (unknown parameters are a 422)."""
    schema = components[model.__name__]
    required = set(schema.get("required", ()))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": field}
        for name, field in schema["properties"].items()
    ]


def _json_body(model: type[BaseModel], description: str, *, required: bool = True) -> dict[str, Any]:
    return {"description": description, "required": required, "content": {JSON_MEDIA_TYPE: {"schema": ref(model)}}}


def _operation(
    operation_id: str, summary: str, *, tag: str, responses: dict[str, Any], problems: tuple[str, ...], **extra: Any
) -> dict[str, Any]:
    return {
        "operationId": operation_id,
        "summary": summary,
        "tags": [tag],
        **extra,
        "responses": {**responses, **problem_responses(problems)},
    }


def _send_message() -> dict[str, Any]:
    return _operation(
        "sendMessage",
        "Store a message in a conversation the caller is a member of",
        tag="messages",
        description="`body` is at most `CHATEXPORT_MESSAGE_BODY_MAX_BYTES` UTF-8 bytes (default 6) and the request "
        "at most `CHATEXPORT_MESSAGE_REQUEST_MAX_BYTES` (default 4096). A `message_id` already stored in the "
        "conversation is a 409, also after a recall.",
        requestBody=_json_body(schemas.MessageSubmission, "The message."),
        responses={"200": _json_response("Stored, with the seq and time it was given.", schemas.StoredMessage)},
        problems=(*ALWAYS, *JSON_BODY, "NOT_FOUND", "DUPLICATE_MESSAGE_ID"),
    )


def _cursor_page(
    operation_id: str,
    summary: str,
    *,
    tag: str,
    query: type[BaseModel],
    page: type[BaseModel],
    components: dict[str, Any],
) -> dict[str, Any]:
    """A GET of one keyset page: its query's parameters, the page with ``no-store``, and a 422 for a bad cursor."""
    return _operation(
        operation_id,
        summary,
        tag=tag,
        description="`cursor` is a `next_cursor` passed back as it is; anything else is a 422.",
        parameters=query_parameters(query, components),
        responses={"200": _json_response("One page.", page, **{"Cache-Control": NO_STORE})},
        problems=(*ALWAYS, "VALIDATION_FAILED"),
    )


def _read_messages(components: dict[str, Any]) -> dict[str, Any]:
    return _operation(
        "readMessages",
        "Read non-recalled messages in seq order",
        tag="messages",
        description="Query values are plain decimal digits; other values and unknown parameters are a 422.",
        parameters=query_parameters(schemas.MessagePageQuery, components),
        responses={"200": _json_response("One page of messages.", schemas.MessagePage)},
        problems=(*ALWAYS, "VALIDATION_FAILED", "NOT_FOUND"),
    )


def _recall_message() -> dict[str, Any]:
    return _operation(
        "recallMessage",
        "The sender recalls a message",
        tag="messages",
        description="Idempotent. Anyone but the sender, a missing message or conversation: the same 404.",
        responses={"200": _json_response("Recalled; it is never exported.", schemas.RecalledMessage)},
        problems=(*ALWAYS, "NOT_FOUND"),
    )


def _submit_export() -> dict[str, Any]:
    key = {
        "name": IDEMPOTENCY_HEADER,
        "in": "header",
        "required": True,
        "description": "1-255 visible ASCII characters, optionally as an RFC 8941 string in double quotes; "
        "scoped to the caller. The same key and request within the replay window replays the first answer.",
        "schema": {"type": "string", "pattern": "^[!-~]{1,255}$"},
    }
    accepted = _json_response(
        "The operation is stored with its scheduling intent (or this is a replay): its current representation.",
        schemas.Operation,
        **{
            "Location": OPERATION_LOCATION,
            "Cache-Control": NO_STORE,
            "Retry-After": _retry_after("Seconds before the first poll, while not terminal.", required=False),
            "Idempotent-Replayed": _header("Present on a replay.", {"const": "true"}),
        },
    )
    return _operation(
        "submitExport",
        "Submit an export of a conversation",
        tag="exports",
        description="Checks in this order: token, Idempotency-Key, body, membership, idempotency, quota. "
        "The body is at most `CHATEXPORT_EXPORT_REQUEST_MAX_BYTES` bytes (by default "
        f"{Settings.model_fields['export_request_max_bytes'].default}, which fits the largest valid body).",
        parameters=[key],
        requestBody=_json_body(schemas.ExportSubmission, "What to export."),
        responses={"202": accepted},
        problems=(
            *ALWAYS,
            "IDEMPOTENCY_KEY_MISSING",
            "IDEMPOTENCY_KEY_INVALID",
            *JSON_BODY,
            "NOT_FOUND",
            "IDEMPOTENCY_KEY_REUSED",
            "IDEMPOTENCY_KEY_EXPIRED",
            "TOO_MANY_ACTIVE_EXPORTS",
            "NOTIFY_URL_REFUSED",
        ),
    )


def _webhook_secret() -> dict[str, Any]:
    return _operation(
        "getWebhookSecret",
        "The caller's signing secret for completion callbacks",
        tag="exports",
        description="Callbacks carry Standard Webhooks signatures made with this secret (and, while the "
        "deployment key is rotated, with `previous_secret` too). Only its owner can read it.",
        responses={"200": _json_response("The secret.", schemas.WebhookSecret, **{"Cache-Control": NO_STORE})},
        problems=ALWAYS,
    )


def _get_operation(components: dict[str, Any]) -> dict[str, Any]:
    poll = _retry_after("Seconds before polling again, while not terminal.", required=False)
    return _operation(
        "getOperation",
        "The status monitor of an export",
        tag="operations",
        description="With `wait` (1-60 seconds) a long poll: answered as soon as the state differs from the one "
        "it had when the request arrived, at once when it is terminal, else after `wait` seconds; progress alone "
        "does not end it. The caller's waiting requests are capped: 429 `TOO_MANY_WAITERS` beyond.",
        parameters=query_parameters(schemas.OperationQuery, components),
        responses={
            "200": _json_response(
                "The operation's current representation.",
                schemas.Operation,
                **{"Cache-Control": NO_STORE, "Retry-After": poll},
            )
        },
        problems=(*ALWAYS, "NOT_FOUND", "VALIDATION_FAILED", "TOO_MANY_WAITERS"),
    )


def _operation_events() -> dict[str, Any]:
    # OpenAPI 3.2's convention, which schemathesis checks: the schema of one event; comments are not events.
    stream_schema = {
        "description": "One server-sent event; `: heartbeat` comments come between events.",
        "type": "object",
        "properties": {
            "event": {"const": "operation"},
            "id": {"type": "string", "pattern": "^[0-9]+$", "description": "The operation's version."},
            "data": {
                "type": "string",
                "description": "The `Operation` as one line of JSON.",
                "contentMediaType": JSON_MEDIA_TYPE,
                "contentSchema": ref(schemas.Operation),
            },
        },
        "required": ["event", "id", "data"],
    }
    return _operation(
        "streamOperationEvents",
        "The operation's changes as server-sent events",
        tag="operations",
        description="The representation on connect (unless `Last-Event-ID` is its current version) and on every "
        "change, progress at most twice a second, until a terminal state: the stream sends it, then ends. A "
        "wake-up hint: `getOperation` stays the source of truth.",
        parameters=[
            {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
                "description": "The `id` of the last event received. Only the current version holds back the "
                "representation on connect; any other value (older, above the current version, negative, not a "
                "number) gets it at once.",
            }
        ],
        responses={
            "200": {
                "description": "The event stream.",
                "headers": {"Cache-Control": NO_STORE},
                "content": {EVENT_STREAM: {"schema": stream_schema}},
            },
            "204": {
                "description": "The operation is terminal and `Last-Event-ID` is its version: nothing more will "
                "come (this stops an `EventSource` from reconnecting).",
                "headers": {"Cache-Control": NO_STORE},
            },
        },
        problems=(*ALWAYS, "NOT_FOUND", "VALIDATION_FAILED", "TOO_MANY_WAITERS"),
    )


def _cancel_operation() -> dict[str, Any]:
    return _operation(
        "cancelOperation",
        "Request cancellation of an export",
        tag="operations",
        description="Idempotent. After SUCCEEDED, FAILED, FAILED_REPAIR or EXPIRED: 409 `ALREADY_TERMINAL` with "
        "the `state`.",
        requestBody=_json_body(schemas.EmptyRequest, "Empty, or `{}`.", required=False),
        responses={
            "200": _json_response("Already CANCELED.", schemas.Operation, **{"Cache-Control": NO_STORE}),
            "202": _json_response(
                "CANCEL_REQUESTED is stored; the worker or the janitor finishes the cancellation.",
                schemas.Operation,
                **{
                    "Location": OPERATION_LOCATION,
                    "Cache-Control": NO_STORE,
                    "Retry-After": _retry_after("Seconds before polling again.", required=True),
                },
            ),
        },
        problems=(*ALWAYS, *JSON_BODY, "NOT_FOUND", "ALREADY_TERMINAL"),
    )


# The result's validators (RFC 9110 section 8.8), sent with the file and with a 304.
_VALIDATORS = {
    "ETag": _header("The file's quoted sha256.", {"type": "string", "pattern": '^"[0-9a-f]{64}"$'}, required=True),
    "Last-Modified": _header("When the result was published (IMF-fixdate).", {"type": "string"}, required=True),
}


def _file_response(description: str, *, partial: bool) -> dict[str, Any]:
    headers = {
        "Cache-Control": NO_STORE,
        "Content-Length": _header("Bytes in this response.", {"type": "integer", "minimum": 0}, required=True),
        "Content-Disposition": _header(
            "`<conversation>-<creation date, UTC>.<extension>` (a part: `...part-<n>.<extension>`); `filename*` "
            "(RFC 8187) when the name is not plain ASCII.",
            {"type": "string", "pattern": '^attachment; filename=".+"'},
            required=True,
        ),
        "Repr-Digest": _header(
            "The whole file's sha-256 (RFC 9530), also on a 206.",
            {"type": "string", "pattern": "^sha-256=:[A-Za-z0-9+/]{43}=:$"},
            required=True,
        ),
        "Content-Security-Policy": _header(
            "A downloaded HTML file never runs with this origin.", {"const": "sandbox"}, required=True
        ),
        "X-Content-Type-Options": _header("No type sniffing.", {"const": "nosniff"}, required=True),
        **_VALIDATORS,
        "Accept-Ranges": _header("One byte range per request.", {"const": "bytes"}, required=True),
    }
    if partial:
        headers["Content-Range"] = _header(
            "The bytes sent.", {"type": "string", "pattern": "^bytes [0-9]+-[0-9]+/[0-9]+$"}, required=True
        )
    return {"description": description, "headers": headers, "content": _FILE_CONTENT}


# The file in each format (README: API reference, The file; Export options).
_FILE_CONTENT = {
    "application/x-ndjson": {
        "schema": {
            "type": "string",
            "description": "UTF-8, one `Message` JSON object per line in ascending seq, each line ending in `\\n`.",
        }
    },
    "text/csv; charset=utf-8": {
        "schema": {
            "type": "string",
            "description": "RFC 4180 with a header row, one row per message; a text cell starting with `=`, `+`, "
            "`-`, `@`, tab or CR starts with `'`.",
        }
    },
    "text/html; charset=utf-8": {
        "schema": {"type": "string", "description": "One self-contained transcript, grouped by day (UTC)."}
    },
    GZIP_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary", "description": "The file, gzip-compressed."}},
}


def _download_result(*, part: bool) -> dict[str, Any]:
    byte_range = {
        "name": "Range",
        "in": "header",
        "required": False,
        "description": "One byte range: `bytes=a-b`, `bytes=a-` or `bytes=-n`; several ranges or bad syntax: ignored.",
        "schema": {"type": "string"},
    }
    conditions = [
        _condition("If-Match", "412 unless one of these entity-tags matches strongly (or `*`)."),
        _condition("If-Unmodified-Since", "Without If-Match: 412 if the result was published later."),
        _condition("If-None-Match", "304 when one of these entity-tags matches weakly (or `*`)."),
        _condition("If-Modified-Since", "Without If-None-Match: 304 unless the result was published later."),
        _condition("If-Range", "Range applies only when this is the current ETag or exactly Last-Modified."),
    ]
    what = "one part of a split result (`result.parts`)" if part else "the file of a result that is not split"
    return _operation(
        "downloadResultPart" if part else "downloadResult",
        f"Download {what}",
        tag="exports",
        description="Checks in this order: token, owner, state, the owner's current membership, then the "
        "preconditions of RFC 9110 section 13.2.2. Every attempt is recorded as an access event. Each user has "
        "at most `CHATEXPORT_DOWNLOAD_PER_USER_CONCURRENCY` downloads open (429 beyond).",
        parameters=[byte_range, *conditions],
        responses={
            "200": _file_response("The whole file.", partial=False),
            "206": _file_response("The requested byte range.", partial=True),
            "304": {
                "description": "Not modified: the client's copy is current.",
                "headers": {"Cache-Control": NO_STORE, **_VALIDATORS},
            },
        },
        problems=(
            *ALWAYS,
            "NOT_FOUND",
            "RESULT_EXPIRED",
            "RESULT_NOT_READY",
            "RESULT_NOT_AVAILABLE",
            *(() if part else ("RESULT_IN_PARTS",)),
            "ACCESS_REVOKED",
            "PRECONDITION_FAILED",
            "RANGE_NOT_SATISFIABLE",
            "TOO_MANY_DOWNLOADS",
        ),
    )


def _condition(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "description": description, "schema": {"type": "string"}}


def _openapi_document() -> dict[str, Any]:
    return {
        "operationId": "getOpenApiDocument",
        "summary": "This document",
        "tags": ["meta"],
        "security": [],
        "responses": {
            "200": {"description": "OpenAPI 3.1.", "content": {JSON_MEDIA_TYPE: {"schema": {"type": "object"}}}}
        },
    }


def _head(get: dict[str, Any]) -> dict[str, Any]:
    """The HEAD twin aiohttp adds to a GET route: the same answers and headers, without a body."""
    responses = {
        status: {key: value for key, value in response.items() if key != "content"}
        for status, response in get["responses"].items()
    }
    return {
        **get,
        "operationId": f"{get['operationId']}Head",
        "summary": f"Headers of: {get['summary']}",
        "responses": responses,
    }


def paths(components: dict[str, Any]) -> dict[str, Any]:
    """The path items of every ``/v2`` and ``/v3`` route; ``components`` are the component schemas."""
    items: dict[str, dict[str, Any]] = {
        "/v2/conversations": {
            "get": _cursor_page(
                "listConversations",
                "The conversations the caller is a member of, by id",
                tag="messages",
                query=schemas.ConversationListQuery,
                page=schemas.ConversationPage,
                components=components,
            )
        },
        "/v2/conversations/{cid}/messages": {
            "parameters": [CID],
            "post": _send_message(),
            "get": _read_messages(components),
        },
        "/v2/conversations/{cid}/messages/{message_id}": {"parameters": [CID, MESSAGE_ID], "delete": _recall_message()},
        "/v3/conversations/{cid}/exports": {"parameters": [CID], "post": _submit_export()},
        "/v3/operations": {
            "get": _cursor_page(
                "listOperations",
                "The caller's operations, newest first",
                tag="operations",
                query=schemas.OperationListQuery,
                page=schemas.OperationPage,
                components=components,
            )
        },
        "/v3/operations/{operation_id}": {"parameters": [OPERATION_ID], "get": _get_operation(components)},
        "/v3/operations/{operation_id}/cancel": {"parameters": [OPERATION_ID], "post": _cancel_operation()},
        "/v3/webhooks/secret": {"get": _webhook_secret()},
        "/v3/exports/{operation_id}/result": {"parameters": [OPERATION_ID], "get": _download_result(part=False)},
        "/v3/exports/{operation_id}/result/parts/{number}": {
            "parameters": [OPERATION_ID, PART_NUMBER],
            "get": _download_result(part=True),
        },
        OPENAPI_PATH: {"get": _openapi_document()},
    }
    with_head = {path: {**item, "head": _head(item["get"])} if "get" in item else item for path, item in items.items()}
    # A stream has no HEAD: its headers would wait for the end of the stream.
    with_head[EVENTS_PATH] = {"parameters": [OPERATION_ID], "get": _operation_events()}
    return with_head


INFO_DESCRIPTION = (
    "Export a chat conversation's history without holding a request open: submit an export (202), poll its "
    "operation, cancel it, download the file. Every route but this document needs `Authorization: Bearer <JWT>`. "
    "Every error is `application/problem+json` with a stable `code`. Unknown routes answer 404; a method a route "
    "does not have answers 405 with `Allow`. A request body is taken only without a content coding (else 415 "
    "`UNSUPPORTED_CONTENT_ENCODING`) and must arrive in full within `CHATEXPORT_REQUEST_BODY_TIMEOUT_SECONDS` "
    "(default 30) of being read (else 408 `REQUEST_TIMEOUT`, and the connection is closed)."
)


def build_document() -> dict[str, Any]:
    """Build the OpenAPI 3.1 document as a JSON-ready dict."""
    components = component_schemas()
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "chatexport",
            "version": importlib.metadata.version("chatexport"),
            "description": INFO_DESCRIPTION,
        },
        "security": [{"bearerAuth": []}],
        "tags": [{"name": name} for name in ("messages", "exports", "operations", "meta")],
        "paths": paths(components),
        "components": {
            "schemas": components,
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        },
    }


@functools.cache
def document_bytes() -> bytes:
    """The document as UTF-8 JSON, built once per process (it depends on no setting)."""
    return json.dumps(build_document(), ensure_ascii=False).encode()
