"""The API's HTTP server: aiohttp's, with requests that break HTTP itself answered as problems.

aiohttp's HTTP parser refuses such requests (a malformed request line, an invalid header, a line over
8190 bytes, a bad chunk) before any route or middleware sees them, and ``RequestHandler.handle_error``
answers them with a plain-text 400 that quotes the offending line back and logs it with a traceback.
Here they get an RFC 9457 problem with a stable ``code`` and a log line naming only the parser error's class
(docs/api.md: Every request, Requests that break HTTP itself).

aiohttp builds one ``RequestHandler`` per connection from the ``web.Server`` that ``AppRunner`` makes, so
``ApiRunner`` switches that server to ``_ProblemServer``, whose handlers are ``_ProblemRequestHandler``. Both
switches reassign ``__class__`` of the object aiohttp built, so every attribute aiohttp set on it (the
application's handler, the handler's keyword arguments) stays as aiohttp made it; they rely only on
``AppRunner._make_server`` returning the server, ``web.Server.__call__`` returning the handler, and
``RequestHandler.handle_error``'s signature, and on ``web.Server.request_handler`` being the callable each
new connection serves (wrapped to answer an unmet ``Expect``); the head deadline relies on
``RequestHandler.data_received`` feeding the parser, which appends each complete request head with its body
to ``_messages`` and counts it in ``_request_count``. ``tests/http/test_http_faults.py`` fails if an aiohttp
upgrade breaks that. (Subclassing ``web.Application`` instead is deprecated by aiohttp.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import hdrs, web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError, LineTooLong
from aiohttp.streams import StreamReader
from multidict import CIMultiDict

from services.api.http.bodies import unsupported_content_encoding
from services.api.http.keys import SETTINGS
from services.api.http.metrics import HEAD_TIMEOUTS
from services.api.http.problems import ProblemError
from shared.settings import ApiPartSettings

log = logging.getLogger(__name__)

# run_app's default; AppRunner's own (3630 s) would hold an idle connection for an hour.
KEEPALIVE_TIMEOUT_SECONDS = 75.0


def parser_problem(exc: BaseException, *, max_line_bytes: int) -> ProblemError:
    """The problem answering a request aiohttp's HTTP parser refused with ``exc``; never quotes the request.

    A line over ``max_line_bytes`` is 431 ``REQUEST_HEADER_TOO_LARGE`` (RFC 6585 section 5; aiohttp does not
    tell a long request line from a long header field); a ``Content-Encoding`` the parser cannot decode is
    415 ``UNSUPPORTED_CONTENT_ENCODING`` with ``Accept-Encoding: identity`` (RFC 9110 section 15.5.16); any
    other parser error is 400 ``MALFORMED_REQUEST``.
    """
    if isinstance(exc, LineTooLong):
        return ProblemError(
            "REQUEST_HEADER_TOO_LARGE", f"The request line or a header field is longer than {max_line_bytes} bytes."
        )
    if isinstance(exc, ContentEncodingError):
        return unsupported_content_encoding()
    return ProblemError("MALFORMED_REQUEST", "The request is not valid HTTP/1.1; the connection is closed.")


class _HeadWatch:
    """One connection's watch over its request heads: the timer of a head in progress, and the body of the
    last request (until it has arrived in full, the bytes that come are body, not a new head).
    """

    __slots__ = ("payload", "timer")

    def __init__(self) -> None:
        self.timer: asyncio.TimerHandle | None = None
        self.payload: StreamReader | None = None

    def stop(self) -> None:
        """Cancel the timer of the head in progress, if any."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class _ProblemRequestHandler(web.RequestHandler):
    """A connection whose HTTP-level errors are answered as problems and logged without the request, and
    that is closed when a request's line and header fields do not arrive within the head deadline.
    """

    __slots__ = ()

    def data_received(self, data: bytes) -> None:
        """Feed ``data`` to aiohttp's parser, timing the request head it belongs to: bytes that come while no
        body is due start the deadline (``_ProblemServer.head_timeout`` seconds) unless it runs already, and a
        complete head stops it (docs/security.md: Slow clients). aiohttp itself only bounds a connection by its
        keep-alive timeout.
        """
        server = cast(_ProblemServer, self._manager)
        watch = server.head_watches.get(self)
        if watch is None:  # once per connection: this runs for every chunk a connection receives
            watch = server.head_watches[self] = _HeadWatch()
        awaiting_head = watch.payload is None or watch.payload.is_eof()
        requests = self._request_count
        super().data_received(data)
        if self._request_count != requests:
            watch.stop()
            watch.payload = self._messages[-1][1] if self._messages else None
        elif awaiting_head and watch.timer is None and not self._force_close:
            watch.timer = self._loop.call_later(server.head_timeout, self._head_too_slow)

    def _head_too_slow(self) -> None:
        HEAD_TIMEOUTS.inc()
        log.info("request head too slow: connection closed")
        self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        """Stop watching the connection, then let aiohttp clean up."""
        manager = cast("_ProblemServer | None", self._manager)
        if manager is not None:
            watch = manager.head_watches.pop(self, None)
            if watch is not None:
                watch.stop()
        super().connection_lost(exc)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """Answer a request the parser refused (``exc`` an ``HttpProcessingError``, ``status`` 400) or whose
        handler failed outside the request middleware (500, or 504 for a timeout) as a problem that closes
        the connection, as aiohttp's own answer does. ``message`` is the parser's text and is never used.

        Raises ``ConnectionError`` when part of another response was sent already, as aiohttp does.
        """
        if isinstance(exc, HttpProcessingError):
            problem = parser_problem(exc, max_line_bytes=max(self.max_line_size, self.max_field_size))
            log.info(
                "request refused by the HTTP parser",
                extra={"error": type(exc).__name__, "code": problem.code, "status": problem.status},
            )
        else:
            log.error("unhandled error", exc_info=exc, extra={"status": status})
            problem = ProblemError("INTERNAL", "An internal error occurred.")
        if request.writer.output_size > 0:
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        response = problem.response()
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """Log as aiohttp does, except that a parser error (a body's broken framing found while aiohttp
        drains it, say) is named by its class only: its text quotes the request.
        """
        error = kw.get("exc_info")
        if isinstance(error, HttpProcessingError | web.RequestPayloadError):
            log.info("request refused by the HTTP parser", extra={"error": type(error).__name__})
            return
        super().log_exception(*args, **kw)


class _ProblemServer(web.Server):
    """A ``web.Server`` whose connections are ``_ProblemRequestHandler``s; ``head_timeout`` is their head
    deadline in seconds and ``head_watches`` their watches, while they are open.
    """

    head_timeout: float
    head_watches: dict[web.RequestHandler, _HeadWatch]

    def __call__(self) -> web.RequestHandler:
        handler = super().__call__()
        handler.__class__ = _ProblemRequestHandler
        return handler


def _answering_expectations(handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]) -> Any:
    """``handler`` (the application's) behind a check of ``Expect`` (RFC 9110 section 10.1.1): its lines are
    one list, in which empty elements do not count; any member but ``100-continue`` is answered with the
    problem ``417 EXPECTATION_FAILED``, which quotes nothing, before routing. aiohttp itself reads only the
    first line and refuses any spelling but one exact ``100-continue`` with a plain text that quotes it, so a
    request that expects only ``100-continue`` reaches it with the field in that one spelling.
    """

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        lines = request.headers.getall(hdrs.EXPECT, [])
        if not lines:
            return await handler(request)
        members = [member.strip(" \t").lower() for line in lines for member in line.split(",")]
        members = [member for member in members if member]
        if any(member != "100-continue" for member in members):
            log.info("request refused for its Expect field", extra={"code": "EXPECTATION_FAILED"})
            problem = ProblemError("EXPECTATION_FAILED", "The only expectation this server meets is 100-continue.")
            response = problem.response()
            response.force_close()
            return response
        if lines != ["100-continue"]:
            headers = CIMultiDict(request.headers)
            headers.popall(hdrs.EXPECT)
            if members:
                headers[hdrs.EXPECT] = "100-continue"
            request = request.clone(headers=headers)
        return await handler(request)

    return handle


class ApiRunner(web.AppRunner):
    """An ``AppRunner`` whose server answers requests that break HTTP as problems (see the module)."""

    __slots__ = ()

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _ProblemServer
        assert isinstance(server, _ProblemServer)
        server.head_timeout = self._app[SETTINGS].request_header_timeout_seconds
        server.head_watches = {}
        server.request_handler = _answering_expectations(server.request_handler)
        return server


def api_runner(app: web.Application, settings: ApiPartSettings, **kwargs: Any) -> ApiRunner:
    """The runner that serves the API ``app``: on cleanup, in-flight requests get
    ``settings.shutdown_grace_seconds``; no access log; request bodies are never decoded (the routes that
    read one refuse a ``Content-Encoding`` other than ``identity``, docs/api.md: API reference). ``kwargs`` go to
    ``web.AppRunner`` and override these.
    """
    options: dict[str, Any] = {
        "shutdown_timeout": settings.shutdown_grace_seconds,
        "keepalive_timeout": KEEPALIVE_TIMEOUT_SECONDS,
        "access_log": None,
        "auto_decompress": False,
        **kwargs,
    }
    return ApiRunner(app, **options)
