"""The OpenAPI 3.1 document of the public API (``/v2`` and ``/v3``), which ``GET /v3/openapi.json`` serves
(``services.api.views.document``).

Its paths are the documented routes of the route table (``shared.routes.ROUTES``), each described by the
``Endpoint`` declared beside its view (``services.api.http.contract``). Component schemas are generated from the
pydantic models those endpoints name (``services.api.http.schemas``), so a change to a model changes the document.
Each route's problem codes (``services.api.http.problems.CODES``) are grouped by status into
``application/problem+json`` responses whose ``code`` is limited to them. The admin routes are operator tooling
and are not part of this document.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from services.api.http import schemas
from services.api.http.bodies import JSON_MEDIA_TYPE
from services.api.http.contract import ANY_ROUTE_PROBLEMS, REF_TEMPLATE, Answer, Endpoint, header, ref, retry_after
from services.api.http.problems import CODES, PROBLEM_CONTENT_TYPE
from services.api.http.rate_fields import LIMIT_FIELD, POLICY_FIELD
from services.api.views import attachments, document, exports, limits, messages, operations, schedules, webhooks
from shared.ids import ID_PATTERN, OPERATION_ID_PATTERN
from shared.rate_policies import PolicyName
from shared.routes import ROUTES, Route
from shared.version import VERSION

ENDPOINTS: dict[str, Endpoint] = {
    endpoint.route: endpoint
    for endpoint in (
        *messages.ENDPOINTS,
        *attachments.ENDPOINTS,
        *exports.ENDPOINTS,
        *operations.ENDPOINTS,
        *webhooks.ENDPOINTS,
        *limits.ENDPOINTS,
        *schedules.ENDPOINTS,
        *document.ENDPOINTS,
    )
}

SchemaMode = Literal["validation", "serialization"]


def _models(endpoints: Iterable[Endpoint]) -> tuple[tuple[type[BaseModel], SchemaMode], ...]:
    """(model, pydantic JSON schema mode) of every model ``endpoints`` name, and of the problem: requests are
    described as validated, responses as serialised.
    """
    models: dict[type[BaseModel], SchemaMode] = {}
    for endpoint in endpoints:
        for request in (endpoint.body.model if endpoint.body else None, endpoint.query):
            if request is not None:
                models[request] = "validation"
        models.update((answer.model, "serialization") for answer in endpoint.answers if answer.model is not None)
    models[schemas.Problem] = "serialization"
    return tuple(models.items())


MODELS = _models(ENDPOINTS.values())

# The fields of draft-ietf-httpapi-ratelimit-headers (docs/api.md: Rate limits, The fields): on every answer of a
# route a policy counts, and on every refusal by a policy; absent when CHATEXPORT_RATE_LIMIT_FIELDS is off.
RATE_LIMIT_HEADERS = {
    POLICY_FIELD: header(
        'The policies this answer concerns: a Structured Fields List of Strings, `"<policy>";q=<quota>[;w=<window'
        ' seconds>][;qu="<unit>"];pk=:<partition key>:`.',
        {"type": "string"},
    ),
    LIMIT_FIELD: header(
        'Where the caller stands against them: `"<policy>";r=<remaining>[;t=<seconds to renewal>];pk=:<partition'
        " key>:`.",
        {"type": "string"},
    ),
}
# The problems a route a policy counts may answer besides its own, by policy.
POLICY_PROBLEMS: dict[PolicyName, tuple[str, ...]] = {
    PolicyName.SUBMITS: ("RATE_LIMITED", "CONTENT_BYTES_SPENT"),
    PolicyName.POLLS: ("RATE_LIMITED",),
    PolicyName.DOWNLOADS: ("RATE_LIMITED",),
}
_QUOTA_HEADERS = {"Retry-After": retry_after("Seconds before trying again.", required=True), **RATE_LIMIT_HEADERS}

# Headers that come with a problem code wherever it is answered.
PROBLEM_HEADERS: dict[str, dict[str, dict[str, Any]]] = {
    "UNAUTHENTICATED": {
        "WWW-Authenticate": header(
            'RFC 6750 challenge; `error_description` is "expired" only for a genuine token past its `exp`.',
            {"enum": [f'Bearer error="invalid_token", error_description="{why}"' for why in ("invalid", "expired")]},
            required=True,
        )
    },
    "UNSUPPORTED_CONTENT_ENCODING": {
        "Accept-Encoding": header(
            "With `UNSUPPORTED_CONTENT_ENCODING`: the only coding accepted.", {"const": "identity"}
        )
    },
    "TOO_MANY_ACTIVE_EXPORTS": _QUOTA_HEADERS,
    "TOO_MANY_DOWNLOADS": _QUOTA_HEADERS,
    "TOO_MANY_WAITERS": _QUOTA_HEADERS,
    "TOO_MANY_UPLOADS": _QUOTA_HEADERS,
    "RATE_LIMITED": _QUOTA_HEADERS,
    "CONTENT_BYTES_SPENT": _QUOTA_HEADERS,
    "SERVICE_UNAVAILABLE": {"Retry-After": retry_after("Seconds before trying again.", required=True)},
    "RANGE_NOT_SATISFIABLE": {
        "Content-Range": header("The file's size.", {"type": "string", "pattern": "^bytes \\*/[0-9]+$"}, required=True)
    },
}


def component_schemas() -> dict[str, Any]:
    """The component schemas of ``MODELS`` and of every model or enum they use, keyed by class name."""
    _, definitions = models_json_schema(MODELS, ref_template=REF_TEMPLATE)
    return dict(sorted(definitions["$defs"].items()))


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


# Every path parameter of a documented route, by name.
PATH_PARAMETERS = {
    "cid": _path_parameter(
        "cid",
        {"type": "string", "pattern": f"^{ID_PATTERN}$"},
        "Conversation id. One that breaks this syntax cannot exist: the same 404 as a missing conversation.",
    ),
    "operation_id": _path_parameter(
        "operation_id",
        {"type": "string", "pattern": f"^{OPERATION_ID_PATTERN}$"},
        "Operation id, as in `Location`. An id that is not the caller's answers the same 404 as a missing one.",
    ),
    "schedule_id": _path_parameter(
        "schedule_id",
        {"type": "string", "pattern": f"^{OPERATION_ID_PATTERN}$"},
        "Schedule id, as in `Location`. An id that is not the caller's answers the same 404 as a missing one.",
    ),
    "number": _path_parameter(
        "number", {"type": "string", "pattern": "^[1-9][0-9]*$"}, "A part's `number` from `result.parts` (1-based)."
    ),
    "message_id": _path_parameter("message_id", {"type": "string", "minLength": 1, "maxLength": 64}, "Message id."),
    "attachment_id": _path_parameter(
        "attachment_id", {"type": "string", "minLength": 1, "maxLength": 64}, "Attachment id, as its upload answered."
    ),
}


def query_parameters(model: type[BaseModel], components: dict[str, Any]) -> list[dict[str, Any]]:
    """The fields of a query model as OpenAPI query parameters (unknown parameters are a 422)."""
    schema = components[model.__name__]
    required = set(schema.get("required", ()))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": field}
        for name, field in schema["properties"].items()
    ]


def _answer(answer: Answer) -> dict[str, Any]:
    response: dict[str, Any] = {"description": answer.description}
    if answer.headers:
        response["headers"] = dict(answer.headers)
    if answer.model is not None:
        response["content"] = {JSON_MEDIA_TYPE: {"schema": ref(answer.model)}}
    elif answer.content is not None:
        response["content"] = dict(answer.content)
    return response


def _operation(route: Route, endpoint: Endpoint, components: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI operation object of ``route``, described by ``endpoint``."""
    operation: dict[str, Any] = {"operationId": route.name, "summary": endpoint.summary, "tags": [endpoint.tag]}
    if route.public:
        operation["security"] = []
    if endpoint.description is not None:
        operation["description"] = endpoint.description
    query = query_parameters(endpoint.query, components) if endpoint.query is not None else []
    if query or endpoint.parameters:
        operation["parameters"] = [*query, *endpoint.parameters]
    if endpoint.body is not None:
        body = endpoint.body
        content = body.content if body.model is None else {JSON_MEDIA_TYPE: {"schema": ref(body.model)}}
        operation["requestBody"] = {"description": body.description, "required": body.required, "content": content}
    problems = endpoint.problems if route.public else (*ANY_ROUTE_PROBLEMS, *endpoint.problems)
    answers = {str(answer.status): _answer(answer) for answer in endpoint.answers}
    if route.policy is not None:
        problems = (*problems, *(code for code in POLICY_PROBLEMS[route.policy] if code not in problems))
        for response in answers.values():
            response["headers"] = {**response.get("headers", {}), **RATE_LIMIT_HEADERS}
    operation["responses"] = {**answers, **problem_responses(problems)}
    return operation


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
    """The path items of every documented route; ``components`` are the component schemas."""
    items: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        if not route.documented:
            continue
        item = items.setdefault(route.path, {})
        if route.parameters:
            item["parameters"] = [PATH_PARAMETERS[name] for name in route.parameters]
        operation = _operation(route, ENDPOINTS[route.name], components)
        item[route.method.lower()] = operation
        if route.method == "GET" and route.head:
            item["head"] = _head(operation)
    return items


INFO_DESCRIPTION = (
    "Export a chat conversation's history without holding a request open: submit an export (202), poll its "
    "operation, cancel it, download the file; or schedule exports, each run picking up where the last ended. "
    "Every route but this document needs `Authorization: Bearer <JWT>`. "
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
            "version": VERSION,
            "description": INFO_DESCRIPTION,
        },
        "security": [{"bearerAuth": []}],
        "tags": [{"name": name} for name in ("messages", "exports", "operations", "meta", "schedules")],
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
