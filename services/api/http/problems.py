"""RFC 9457 problem responses with stable ``code`` strings (README: Error codes).

A handler raises ``ProblemError``; the error middleware renders it. Nothing here may echo a message body, a
token or a signed URL.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from shared import jsontext

PROBLEM_CONTENT_TYPE = "application/problem+json"

# code -> (status, title); one table so every response for a code looks the same.
CODES: dict[str, tuple[int, str]] = {
    "UNAUTHENTICATED": (401, "Authentication required"),
    "FORBIDDEN": (403, "Forbidden"),
    "NOT_FOUND": (404, "Not found"),
    "CONVERSATION_NOT_FOUND": (404, "Conversation not found"),
    "METHOD_NOT_ALLOWED": (405, "Method not allowed"),
    "MALFORMED_JSON": (400, "Malformed JSON"),
    "BAD_REQUEST": (400, "Bad request"),
    "MALFORMED_REQUEST": (400, "Malformed request"),
    "REQUEST_HEADER_TOO_LARGE": (431, "Request header fields too large"),
    "EXPECTATION_FAILED": (417, "Expectation failed"),
    "IDEMPOTENCY_KEY_MISSING": (400, "Idempotency-Key missing"),
    "IDEMPOTENCY_KEY_INVALID": (400, "Idempotency-Key invalid"),
    "UNSUPPORTED_MEDIA_TYPE": (415, "Unsupported media type"),
    "UNSUPPORTED_CONTENT_ENCODING": (415, "Unsupported content encoding"),
    "PAYLOAD_TOO_LARGE": (413, "Payload too large"),
    "REQUEST_TIMEOUT": (408, "Request timeout"),
    "VALIDATION_FAILED": (422, "Validation failed"),
    "NOTIFY_URL_REFUSED": (422, "Callback URL refused"),
    "DUPLICATE_MESSAGE_ID": (409, "Duplicate message id"),
    "IDEMPOTENCY_KEY_REUSED": (409, "Idempotency-Key reused"),
    "IDEMPOTENCY_KEY_EXPIRED": (409, "Idempotency-Key expired"),
    "ALREADY_TERMINAL": (409, "Operation already terminal"),
    "NOT_REQUEUEABLE": (409, "Operation not requeueable"),
    "RESULT_NOT_READY": (409, "Result not ready"),
    "RESULT_NOT_AVAILABLE": (409, "Result not available"),
    "RESULT_IN_PARTS": (409, "Result in parts"),
    "ACCESS_REVOKED": (403, "Access revoked"),
    "RESULT_EXPIRED": (410, "Result expired"),
    "RANGE_NOT_SATISFIABLE": (416, "Range not satisfiable"),
    "PRECONDITION_FAILED": (412, "Precondition failed"),
    "TOO_MANY_DOWNLOADS": (429, "Too many downloads"),
    "TOO_MANY_WAITERS": (429, "Too many waiting requests"),
    "TOO_MANY_ACTIVE_EXPORTS": (429, "Too many active exports"),
    "SERVICE_UNAVAILABLE": (503, "Service unavailable"),
    "INTERNAL": (500, "Internal server error"),
}

NOT_FOUND_DETAIL = "The resource does not exist or you may not see it."


class ProblemError(Exception):
    """An error answered as ``application/problem+json``, whose body the model ``schemas.Problem`` describes.

    ``code`` is a key of ``CODES``; ``extra`` members (``errors``, ``state``, ...) are added to the body and
    ``headers`` to the response.
    """

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(code)
        self.code = code
        self.status, self.title = CODES[code]
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra

    def response(self) -> web.Response:
        """Render the problem as a response."""
        body = {
            "type": f"https://chatexport.dev/problems/{self.code.lower().replace('_', '-')}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
            **self.extra,
        }
        return web.Response(
            status=self.status,
            body=jsontext.dumps(body).encode(),
            content_type=PROBLEM_CONTENT_TYPE,
            headers=self.headers,
        )


def not_found() -> ProblemError:
    """The one 404 for "does not exist" and "you may not know it exists": identical bodies (README: Error codes)."""
    return ProblemError("NOT_FOUND", NOT_FOUND_DETAIL)


def validation_failed(errors: list[dict[str, Any]], detail: str = "The request breaks the schema.") -> ProblemError:
    """A 422 with ``errors: [{"loc": [...], "msg": "..."}]`` (README: Error codes)."""
    return ProblemError("VALIDATION_FAILED", detail, errors=errors)
