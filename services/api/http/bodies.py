"""Reading request bodies within each route's limits (docs/api.md: API reference) and validating them with pydantic
models.

Checks run in the documented order: media type and content coding (415), size (413), the body arriving
within its deadline (408) and intact (400), UTF-8 and JSON syntax (400), then the schema (422). Nothing is
stored before all of them passed. Every route that reads a body reads it through ``read_limited``.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar, get_args

from aiohttp import web
from pydantic import BaseModel, ValidationError

from services.api.http.keys import SETTINGS
from services.api.http.problems import MAX_LISTED_ERRORS, ProblemError, validation_failed
from services.api.http.schemas import EmptyQuery, EmptyRequest

ModelT = TypeVar("ModelT", bound=BaseModel)

JSON_MEDIA_TYPE = "application/json"
# The most an action that takes no input reads of a body, which may only be ``{}`` (docs/api.md: Operations,
# Cancel): 1 KiB leaves room for whitespace and nothing else.
EMPTY_BODY_MAX_BYTES = 1024
# What ``read_model`` can answer, in the order it checks.
JSON_BODY_PROBLEMS = (
    "UNSUPPORTED_MEDIA_TYPE",
    "UNSUPPORTED_CONTENT_ENCODING",
    "PAYLOAD_TOO_LARGE",
    "REQUEST_TIMEOUT",
    "MALFORMED_JSON",
    "VALIDATION_FAILED",
)


async def read_limited(request: web.Request, *, max_bytes: int) -> bytes:
    """Return the raw body, at most ``max_bytes`` bytes, read within ``request_body_timeout_seconds``
    (``body_chunks``, whose errors it raises).
    """
    timeout = request.app[SETTINGS].request_body_timeout_seconds
    return b"".join([chunk async for chunk in body_chunks(request, max_bytes=max_bytes, timeout_seconds=timeout)])


async def body_chunks(request: web.Request, *, max_bytes: int, timeout_seconds: float) -> AsyncIterator[bytes]:
    """The raw body as it arrives, at most ``max_bytes`` bytes, the whole of it within ``timeout_seconds`` of
    starting to read (the time the caller spends between chunks counts too).

    Raises ``ProblemError``: 415 ``UNSUPPORTED_CONTENT_ENCODING`` before reading anything when the body has a
    content coding (``require_identity_coding``); 413 beyond ``max_bytes``; 408 ``REQUEST_TIMEOUT`` when
    the whole body has not arrived by the deadline, and 400 ``MALFORMED_REQUEST`` when its framing breaks (the
    request middleware closes the connection after either, docs/api.md: API reference). Streams the body so that
    a lying or absent Content-Length cannot make the server buffer more.
    """
    require_identity_coding(request)
    if request.content_length is not None and request.content_length > max_bytes:
        raise _too_large(max_bytes)
    deadline = asyncio.get_running_loop().time() + timeout_seconds
    size = 0
    while True:
        try:
            # The deadline guards each read only: a timeout around the yields would cancel the caller's work.
            async with asyncio.timeout_at(deadline):
                chunk = await request.content.readany()
        except TimeoutError:
            raise ProblemError(
                "REQUEST_TIMEOUT", f"The request body did not arrive in full within {timeout_seconds:g} s."
            ) from None
        except web.RequestPayloadError:
            # aiohttp's message quotes the offending bytes: only say what happened.
            raise ProblemError("MALFORMED_REQUEST", "The request body's framing is broken.") from None
        if not chunk:
            return
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        yield chunk


def require_identity_coding(request: web.Request) -> None:
    """Raise ``ProblemError`` 415 ``UNSUPPORTED_CONTENT_ENCODING`` with ``Accept-Encoding: identity`` (RFC 9110
    section 15.5.16) unless every coding ``Content-Encoding`` names is ``identity``: the service takes bodies
    only as they are (docs/api.md: API reference). Codings are case-insensitive tokens in comma-separated lists,
    over any number of fields (RFC 9110 section 8.4); an empty list is no coding.
    """
    fields = request.headers.getall("Content-Encoding", ())
    codings = {coding.strip().lower() for field in fields for coding in field.split(",")}
    if codings - {"", "identity"}:
        raise unsupported_content_encoding()


def unsupported_content_encoding() -> ProblemError:
    """415 ``UNSUPPORTED_CONTENT_ENCODING``, naming the one coding a body may have."""
    return ProblemError(
        "UNSUPPORTED_CONTENT_ENCODING",
        "Send the request body without a content coding (no Content-Encoding, or identity).",
        headers={"Accept-Encoding": "identity"},
    )


def _too_large(max_bytes: int) -> ProblemError:
    return ProblemError("PAYLOAD_TOO_LARGE", f"The request body is over this endpoint's limit of {max_bytes} bytes.")


def require_media_type(request: web.Request, media_type: str = JSON_MEDIA_TYPE) -> None:
    """Raise ``ProblemError`` 415 unless the Content-Type is ``media_type`` (parameters such as charset allowed)."""
    if request.content_type != media_type:
        raise ProblemError("UNSUPPORTED_MEDIA_TYPE", f"Send the body as {media_type}.")


def parse_json(raw: bytes) -> Any:
    """Decode strict UTF-8 JSON; raises ``ProblemError`` 400 MALFORMED_JSON otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProblemError("MALFORMED_JSON", "The body is not valid UTF-8.") from None
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_members)
    except json.JSONDecodeError as exc:
        raise ProblemError("MALFORMED_JSON", f"The body is not JSON: {exc.msg} at position {exc.pos}.") from None
    except _NotStrictJson as exc:
        raise ProblemError("MALFORMED_JSON", f"The body is not strict JSON: {exc}.") from None
    except (RecursionError, ValueError):
        # Nesting deeper than the parser's recursion limit, or an integer of thousands of digits.
        raise ProblemError("MALFORMED_JSON", "The body is JSON nested too deeply or with a number too long.") from None


class _NotStrictJson(ValueError):
    """Text Python's parser accepts but RFC 8259 JSON does not (NaN), or that is ambiguous (a repeated name)."""


def _reject_constant(name: str) -> Any:
    raise _NotStrictJson(f"{name} is not a JSON number")


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):
        raise _NotStrictJson("an object repeats a member name")
    return members


async def read_model(request: web.Request, model: type[ModelT], *, max_bytes: int, allow_empty: bool = False) -> ModelT:
    """Read, size-check, parse and validate a JSON body into ``model``.

    With ``allow_empty`` an absent body validates as ``{}``. Raises ``ProblemError`` (415, 413, 400, 422).
    """
    if request.body_exists:
        require_media_type(request)
    raw = await read_limited(request, max_bytes=max_bytes)
    if not raw:
        if not allow_empty:
            raise ProblemError("MALFORMED_JSON", "A JSON body is required.")
        return validate(model, {})
    data = parse_json(raw)
    check_members(model, data)
    return validate(model, data)


def check_members(model: type[BaseModel], data: Any, loc: tuple[Any, ...] = ("body",)) -> None:
    """Refuse a JSON object of ``data`` with more members than the model it is validated with has fields, before
    validating any: at least that many excess members must be unknown, and pydantic would build an error for
    each (docs/api.md: Error codes, Validation problems). Walks ``data`` as ``model``'s fields describe it, into
    the members and list items that a nested model validates. Raises ``ProblemError`` 422 naming the unknown
    members of the first such object, at most ``MAX_LISTED_ERRORS`` of them, with their count.
    """
    if isinstance(data, list):
        for index, item in enumerate(data):
            check_members(model, item, (*loc, index))
        return
    if not isinstance(data, dict):
        return
    fields = _fields(model)
    if len(data) > len(fields):
        unknown = [name for name in data if name not in fields]
        errors = [
            {"loc": [*loc, name], "msg": "Extra inputs are not permitted"} for name in unknown[:MAX_LISTED_ERRORS]
        ]
        raise validation_failed(errors, error_count=len(unknown))
    for name, value in data.items():
        nested = fields.get(name)
        if nested is not None:
            check_members(nested, value, (*loc, name))


@functools.cache
def _fields(model: type[BaseModel]) -> dict[str, type[BaseModel] | None]:
    """The names ``model`` takes in JSON (aliases where set), each with the one model nested in its type (in a
    list, an optional or a union with no other model), else None.
    """
    fields: dict[str, type[BaseModel] | None] = {}
    for name, field in model.model_fields.items():
        nested = set(_models_in(field.annotation))
        fields[field.alias or name] = nested.pop() if len(nested) == 1 else None
    return fields


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in get_args(annotation):
        yield from _models_in(argument)


async def read_empty_input(request: web.Request) -> None:
    """Check the input of an action that takes none (a cancel, a requeue, a schedule's pause and resume): a
    body, if sent, must be ``{}`` as JSON of at most ``EMPTY_BODY_MAX_BYTES``, and the query string must be
    empty (docs/api.md: Operations, Cancel). Raises ``ProblemError`` as ``read_model`` does, then 422 for
    any query parameter, so that the body's checks keep their documented order.
    """
    await read_model(request, EmptyRequest, max_bytes=EMPTY_BODY_MAX_BYTES, allow_empty=True)
    validate_query(EmptyQuery, request)


def validate(model: type[ModelT], data: Any) -> ModelT:
    """Validate ``data`` against ``model``; raises ``ProblemError`` 422 listing the first errors and counting
    all (never the input).
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_failed(validation_errors(exc)) from None


def validate_query(model: type[ModelT], request: web.Request) -> ModelT:
    """Validate the query string of ``request`` against ``model``. A parameter given more than once is a
    422 at ``["query", name]`` (which of its values counts would otherwise be a guess); schema errors are
    422 under ``"query"`` too (docs/api.md: Error codes). Raises ``ProblemError``.
    """
    if not request.query_string:
        return _without_parameters(model)
    repeated = sorted({name for name in request.query if len(request.query.getall(name)) > 1})
    if repeated:
        raise validation_failed([{"loc": ["query", name], "msg": "must be given at most once"} for name in repeated])
    return _parameters(model, dict(request.query))


@functools.cache
def _without_parameters(model: type[ModelT]) -> ModelT:
    """``model`` validated from no parameters, once per model: most polls carry none. Shared, since every query
    model is frozen (``StrictModel``); a model that needs a parameter raises ``ProblemError`` every time, since
    ``functools.cache`` keeps no exception.
    """
    return _parameters(model, {})


def _parameters(model: type[ModelT], parameters: dict[str, str]) -> ModelT:
    try:
        return model.model_validate(parameters)
    except ValidationError as exc:
        raise validation_failed(validation_errors(exc, prefix=("query",))) from None


def validation_errors(exc: ValidationError, *, prefix: tuple[Any, ...] = ("body",)) -> list[dict[str, Any]]:
    """Pydantic errors as the documented ``[{"loc": [...], "msg": "..."}]``, without the offending input."""
    return [{"loc": [*prefix, *error["loc"]], "msg": _message(error)} for error in exc.errors()]


def _message(error: Any) -> str:
    # pydantic's wording for these names its own classes ("instance of ExportSubmission") or prefixes
    # "Value error, "; say what the client must send instead.
    if error["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return "Input should be a JSON object"
    return str(error["msg"]).removeprefix("Value error, ")


def check_body_bytes(body: str, *, max_bytes: int, loc: list[Any]) -> None:
    """Raise ``ProblemError`` 422 at ``loc`` when a message ``body`` is over ``max_bytes`` UTF-8 bytes (docs/api.md:
    Message store, Send; docs/api.md: Administration, Import).
    """
    if len(body.encode("utf-8")) > max_bytes:
        raise validation_failed([{"loc": loc, "msg": f"must be at most {max_bytes} UTF-8 bytes"}])
