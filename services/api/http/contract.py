"""What a documented route takes and answers, declared beside its view as an ``Endpoint`` (docs/api.md: API
reference). ``services.api.openapi`` builds the OpenAPI document's paths from ``shared.routes.ROUTES`` and these
declarations; views never import ``openapi``, which imports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp.typedefs import Handler
from pydantic import BaseModel

from shared.ids import OPERATION_ID_PATTERN
from shared.routes import path

REF_TEMPLATE = "#/components/schemas/{model}"

# Problems every route that needs a token can answer: a bad token, a busy database, an internal fault
# (services.api.http.middlewares; docs/api.md: Error codes), and a request that breaks HTTP itself, which the HTTP
# server answers before any route (services.api.http.server).
ANY_ROUTE_PROBLEMS = (
    "UNAUTHENTICATED",
    "SERVICE_UNAVAILABLE",
    "INTERNAL",
    "MALFORMED_REQUEST",
    "REQUEST_HEADER_TOO_LARGE",
    "EXPECTATION_FAILED",
)


def ref(model: type[BaseModel]) -> dict[str, str]:
    """A JSON reference to the component schema of ``model``."""
    return {"$ref": REF_TEMPLATE.format(model=model.__name__)}


def header(description: str, schema: dict[str, Any], *, required: bool = False) -> dict[str, Any]:
    """An OpenAPI header object (of a response) or the body of a header parameter."""
    return {"description": description, "required": required, "schema": schema}


def header_parameter(name: str, description: str, *, required: bool = False) -> dict[str, Any]:
    """An OpenAPI request header parameter ``name`` whose value is a string."""
    return {"name": name, "in": "header", **header(description, {"type": "string"}, required=required)}


def retry_after(description: str, *, required: bool) -> dict[str, Any]:
    """The ``Retry-After`` header in seconds."""
    return header(description, {"type": "integer", "minimum": 1}, required=required)


NO_STORE_HEADER = header("Operation state changes: never cache.", {"const": "no-store"}, required=True)
OPERATION_ETAG_HEADER = header(
    "The operation's version as a weak entity-tag, for `If-None-Match`.",
    {"type": "string", "pattern": '^W/"[0-9]+"$'},
    required=True,
)
LOCATION_HEADER = header(
    "The operation's status monitor.",
    {"type": "string", "pattern": f"^{path('getOperation', operation_id=OPERATION_ID_PATTERN)}$"},
    required=True,
)


@dataclass(frozen=True)
class Body:
    """A request body: JSON validated with ``model``, or another ``content`` (an OpenAPI content map: media type
    -> media type object), such as a file's bytes.
    """

    model: type[BaseModel] | None
    description: str
    required: bool = True
    content: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Answer:
    """One success answer: its ``status`` and ``description``, a JSON body of ``model`` or another ``content``
    (an OpenAPI content map: media type -> media type object), or no body with neither; ``headers`` maps
    names to ``header`` objects.
    """

    status: int
    description: str
    model: type[BaseModel] | None = None
    content: Mapping[str, Any] | None = None
    headers: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Endpoint:
    """The contract of the route named ``route`` in ``shared.routes.ROUTES`` and its ``handler`` (the route
    table binds one to the other: the route's name is written here and in ``shared.routes`` only); its OpenAPI
    ``summary``,
    ``description`` and ``tag``; the ``query`` model its view validates the query string with, its JSON
    ``body`` and its header ``parameters``; its success ``answers``; and the problem codes (keys of
    ``services.api.http.problems.CODES``) its view can answer besides ``ANY_ROUTE_PROBLEMS``, which every route
    that needs a token can answer.
    """

    route: str
    handler: Handler
    summary: str
    tag: str
    answers: tuple[Answer, ...]
    problems: tuple[str, ...] = ()
    description: str | None = None
    query: type[BaseModel] | None = None
    body: Body | None = None
    parameters: tuple[dict[str, Any], ...] = ()
