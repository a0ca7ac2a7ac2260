"""The request middleware: bearer authentication and rate limits, problem rendering and request metrics in one
layer (docs/api.md: Tokens and keys, Authentication; Error codes; Rate limits).
"""

from __future__ import annotations

import logging
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from services.api.http.fields import RepeatedField, only_field
from services.api.http.keys import LIMITER, PARTITION_KEYS, POLICIES, PRINCIPAL, RATE_LIMITS, SETTINGS, VERIFIER
from services.api.http.metrics import count_request
from services.api.http.problems import ProblemError
from services.api.http.rate_fields import rate_limit_fields
from services.api.limiting.policies import is_exempt
from shared.auth import InvalidToken
from shared.db import TRANSIENT_DATABASE_ERRORS
from shared.rate_policies import SHARED
from shared.routes import ROUTES

log = logging.getLogger(__name__)

PROTECTED_PREFIXES = ("/v2/", "/v3/", "/admin/")
# Public routes under those prefixes are let through; none of them has a path parameter.
PUBLIC_PATHS = frozenset(route.path for route in ROUTES if route.public)

# The routes whose every call the limiter counts (a submit is counted in its own statement, by its view).
_COUNTED_POLICIES = {route.name: route.policy for route in ROUTES if route.policy in SHARED}

# Any other method is counted as "other": the label set stays bounded whatever clients send.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})

_HTTP_CODES = {
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
}

# Refusals that leave the request body unread to its end: where a next request would start on the
# connection is unknown, so it is closed after the answer (RFC 9110 section 15.5.9 for the 408).
_CLOSING_CODES = frozenset({"REQUEST_TIMEOUT", "MALFORMED_REQUEST"})


@web.middleware
async def request_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every request's one middleware (one layer under each poll, docs/benchmark.md: What was tuned), in this
    order:

    - authentication (``_authenticate``): a bearer token on ``/v2``, ``/v3`` and ``/admin`` and the rate limit of
      the route's policy;
    - errors: ``ProblemError`` and aiohttp's HTTP errors rendered as problem+json, any other failure as a bare
      500; a failure after the answer has begun (a download or an event stream) closes the connection instead,
      since a second answer would be read as the rest of the first;
    - metrics: every request counted and timed by method, route template and the final status, the rendered
      problem's included. Unmatched paths share one ``route`` label, so a scanner cannot grow the label set.
    """
    started = time.perf_counter()
    status = 500
    try:
        try:
            await _authenticate(request)
            response = await handler(request)
        except Exception as exc:
            if request.writer.output_size > 0:
                response = _cut_short(request, exc)
            else:
                response = await _problem_for(request, exc)
        status = response.status
        return response
    finally:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        method = request.method if request.method in _METHODS else "other"
        count_request(method, route, status, time.perf_counter() - started)


def _cut_short(request: web.Request, exc: Exception) -> web.StreamResponse:
    """Log a failure that struck after the answer began and close the connection, sending what was written
    first. Returns a stand-in that nobody receives (aiohttp finds the connection closed) but whose status the
    metrics count: 400 for a client that went away, 503 for the database, 500 for anything else.
    """
    if isinstance(exc, ConnectionError) and client_gone(request):
        log.info("client disconnected", extra={"route": request.path})
        status = 400
    elif isinstance(exc, TRANSIENT_DATABASE_ERRORS):
        log.warning("database unavailable mid-answer", extra={"route": request.path, "error": type(exc).__name__})
        status = 503
    else:
        log.error("unhandled error", exc_info=exc, extra={"route": request.path, "method": request.method})
        status = 500
    if request.transport is not None:
        request.transport.close()
    return web.StreamResponse(status=status)


async def _problem_for(request: web.Request, error: Exception) -> web.StreamResponse:
    """The problem+json answer to ``error``, raised by a handler before its answer began."""
    try:
        raise error
    except ProblemError as problem:
        if problem.limits:
            request[RATE_LIMITS] = problem.limits
        if problem.code in _CLOSING_CODES:
            return await _answer_and_close(request, problem.response())
        return problem.response()
    except ConnectionResetError as exc:
        if not client_gone(request):
            # The reset came from the database (a restart drops its connections), not from the client.
            return _unavailable(request, exc)
        # The client went away mid-request: not a fault of ours. The answer reaches nobody; aiohttp only
        # logs the access instead of an error with a traceback.
        log.info("client disconnected", extra={"route": request.path})
        return ProblemError("BAD_REQUEST", "The client disconnected.").response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _from_http_exception(exc).response()
    except TRANSIENT_DATABASE_ERRORS as exc:
        return _unavailable(request, exc)
    except Exception:
        log.exception("unhandled error", extra={"route": request.path, "method": request.method})
        return ProblemError("INTERNAL", "An internal error occurred.").response()


def client_gone(request: web.BaseRequest) -> bool:
    """True once the client's connection is closed or closing."""
    transport = request.transport
    return transport is None or transport.is_closing()


def _unavailable(request: web.Request, exc: BaseException) -> web.Response:
    """503 for a statement timeout (a long import holding a conversation, say) or a database restart: the
    request can succeed when retried, so it is no internal fault (docs/api.md: Error codes).
    """
    log.warning("database unavailable", extra={"route": request.path, "error": type(exc).__name__})
    return ProblemError(
        "SERVICE_UNAVAILABLE", "The service is busy; try again shortly.", headers={"Retry-After": "5"}
    ).response()


async def _answer_and_close(request: web.Request, response: web.Response) -> web.Response:
    """Send ``response`` with ``Connection: close``, then close the connection at once."""
    response.force_close()
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionError:
        pass  # The client is gone; closing is all that is left.
    # Otherwise aiohttp would go on reading the unfinished body for up to 10 s (its lingering close), a
    # wait a stalled client turns into 10 s of an open socket.
    request.protocol.force_close()
    return response


def _from_http_exception(exc: web.HTTPException) -> ProblemError:
    code = _HTTP_CODES.get(exc.status, "BAD_REQUEST" if exc.status < 500 else "INTERNAL")
    headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
    if exc.status == 404:
        detail = "No such route."
    elif headers:
        detail = f"This route does not answer this method; it allows {headers['Allow']}."
    else:
        detail = exc.reason or "Request refused."
    return ProblemError(code, detail, headers=headers)


async def _authenticate(request: web.Request) -> None:
    """Require a valid bearer token on ``/v2``, ``/v3`` and ``/admin``; ``/admin`` also needs ``admin``; then
    count the route's policy for the user (docs/api.md: Tokens and keys, Authentication; Rate limits).

    The public routes of ``shared.routes`` are the exception: clients and tools read the OpenAPI document
    before they hold a token.
    """
    path = request.path
    if not path.startswith(PROTECTED_PREFIXES) or path in PUBLIC_PATHS:
        return
    try:
        principal = await request.app[VERIFIER].verify(_authorization(request))
    except InvalidToken as refusal:
        log.info("token refused", extra={"reason": refusal.reason, "route": request.path})
        description = "expired" if refusal.expired else "invalid"
        raise ProblemError(
            "UNAUTHENTICATED",
            "A valid bearer token is required.",
            headers={"WWW-Authenticate": f'Bearer error="invalid_token", error_description="{description}"'},
        ) from None
    if path.startswith("/admin/") and not principal.is_admin:
        raise ProblemError("FORBIDDEN", "This route needs the admin scope.")
    request[PRINCIPAL] = principal
    # After authentication: a request without a valid token never spends a user's allowance.
    policy = _COUNTED_POLICIES.get(request.match_info.route.name or "")
    if policy is not None and not is_exempt(principal, request.app[SETTINGS]):
        standing = await request.app[LIMITER].admit(principal.user_id, request.app[POLICIES][policy])
        if standing is not None:
            request[RATE_LIMITS] = (standing,)


async def add_rate_limit_fields(request: web.Request, response: web.StreamResponse) -> None:
    """Add the ``RateLimit-Policy`` and ``RateLimit`` fields of the standings the request gathered
    (``RATE_LIMITS``) to its response, as it is prepared, unless ``CHATEXPORT_RATE_LIMIT_FIELDS`` is off
    (docs/api.md: Rate limits, The fields).
    """
    standings = request.get(RATE_LIMITS)
    if not standings or not request.app[SETTINGS].rate_limit_fields:
        return
    response.headers.update(rate_limit_fields(standings, request.app[PARTITION_KEYS](request[PRINCIPAL].user_id)))


def _authorization(request: web.Request) -> str | None:
    """The one ``Authorization`` field's value; raises ``InvalidToken`` when there are several, since
    intermediaries disagree on which one counts (docs/api.md: Tokens and keys, Authentication).
    """
    try:
        return only_field(request.headers, "Authorization")
    except RepeatedField as repeated:
        raise InvalidToken(str(repeated)) from None
