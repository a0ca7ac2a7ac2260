"""RFC 9457 problem responses with stable ``code`` strings (docs/api.md: Error codes).

A handler raises ``ProblemError``; the request middleware renders it. Nothing here may echo a message body, a
token or a signed URL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from aiohttp import web

from shared import jsontext

if TYPE_CHECKING:
    from services.api.limiting.policies import Standing

PROBLEM_CONTENT_TYPE = "application/problem+json"


class ProblemCode(NamedTuple):
    """What a problem code means: its one HTTP ``status``, the ``title`` every answer with it carries, and
    ``when`` it is answered (markdown, a fragment without a final full stop, for the site's problem codes page
    that ``devtools.reference`` generates from ``CODES``).
    """

    status: int
    title: str
    when: str


# The most errors a 422 lists: enough to fix a request by hand, while a body of thousands of wrong members
# cannot make an answer several times its own size (docs/api.md: Error codes, Validation problems).
MAX_LISTED_ERRORS = 10


# Markdown; the problem codes page's prose above its table of ``CODES``.
ABOUT_CODES = """Every `code` an `application/problem+json` answer can carry, with its HTTP status: one status
per code, so that a client may act on either. The body holds `type`, `title`, `status`, `detail` and `code`,
and the extension members the table names (`errors` with `error_count`, `state`, `checks`). An operation's
own `error.code` (`STORAGE_UNAVAILABLE`, `WORKER_LOST`, ...) is not an HTTP answer but part of the
operation's status."""

# code -> its meaning; one table so every response for a code looks the same and its documentation is
# written beside it.
CODES: dict[str, ProblemCode] = {
    "UNAUTHENTICATED": ProblemCode(
        401, "Authentication required", "`/v2`, `/v3` or `/admin` without a valid bearer token; with `WWW-Authenticate`"
    ),
    "FORBIDDEN": ProblemCode(403, "Forbidden", "an `/admin` route without the `admin` scope"),
    "NOT_FOUND": ProblemCode(
        404,
        "Not found",
        "an unknown route; on `/v2` and `/v3` a conversation, message, operation or schedule that does"
        " not exist or that the caller may not see (one body for both); on `/admin` an unknown operation",
    ),
    "CONVERSATION_NOT_FOUND": ProblemCode(
        404,
        "Conversation not found",
        "an `/admin` conversation route (view, member add or remove, import) on a conversation that"
        " does not exist; create it with `PUT /admin/conversations/{cid}`",
    ),
    "METHOD_NOT_ALLOWED": ProblemCode(405, "Method not allowed", "a method the route does not answer; with `Allow`"),
    "MALFORMED_JSON": ProblemCode(
        400, "Malformed JSON", "a JSON body that is not UTF-8, not strict JSON, or missing where one is required"
    ),
    "BAD_REQUEST": ProblemCode(
        400, "Bad request", "any other refusal of the request as HTTP (the client went away mid-request, say)"
    ),
    "MALFORMED_REQUEST": ProblemCode(
        400,
        "Malformed request",
        "a request that is not valid HTTP/1.1, or a body whose framing breaks; the connection is closed",
    ),
    "REQUEST_HEADER_TOO_LARGE": ProblemCode(
        431, "Request header fields too large", "a request line or header field over the parser's line limit"
    ),
    "EXPECTATION_FAILED": ProblemCode(417, "Expectation failed", "an `Expect` field other than `100-continue`"),
    "IDEMPOTENCY_KEY_MISSING": ProblemCode(
        400, "Idempotency-Key missing", "an export submit or a schedule's creation without `Idempotency-Key`"
    ),
    "IDEMPOTENCY_KEY_INVALID": ProblemCode(
        400,
        "Idempotency-Key invalid",
        "an `Idempotency-Key` that breaks the 1-255 visible ASCII rule, or more than one `Idempotency-Key` field",
    ),
    "UNSUPPORTED_MEDIA_TYPE": ProblemCode(
        415,
        "Unsupported media type",
        "a body not sent as `application/json` (an import: `application/x-ndjson` or `application/json`)",
    ),
    "UNSUPPORTED_CONTENT_ENCODING": ProblemCode(
        415,
        "Unsupported content encoding",
        "a body with a content coding other than `identity`; with `Accept-Encoding: identity`",
    ),
    "PAYLOAD_TOO_LARGE": ProblemCode(
        413,
        "Payload too large",
        "a request body over the route's limit (the `CHATEXPORT_*_REQUEST_MAX_BYTES` settings; 1 MiB for a member set)",
    ),
    "REQUEST_TIMEOUT": ProblemCode(
        408,
        "Request timeout",
        "a body that has not arrived in full `CHATEXPORT_REQUEST_BODY_TIMEOUT_SECONDS` after reading"
        " began; the connection is closed",
    ),
    "VALIDATION_FAILED": ProblemCode(
        422,
        "Validation failed",
        "a body, query parameter or (on `/admin`) path id that breaks the rules; `errors` lists the `loc` and"
        f" `msg` of at most {MAX_LISTED_ERRORS}, `error_count` counts them all",
    ),
    "NOTIFY_URL_REFUSED": ProblemCode(
        422,
        "Callback URL refused",
        "a submit or a schedule's creation whose `notify.url` may not receive callbacks (not https,"
        ' user information, a private or local address); `errors` names `["body", "notify", "url"]`',
    ),
    "SCHEDULE_OPTION_REFUSED": ProblemCode(
        422,
        "Schedule option refused",
        "a schedule's creation with `before_seq` or `until`, which would leave every run after the first"
        " empty; `errors` names each",
    ),
    "SCHEDULE_INTERVAL_INVALID": ProblemCode(
        422,
        "Schedule interval invalid",
        "a schedule's `every` that is not an ISO 8601 duration of whole units (`P1D`, `PT6H`, `P1M`), is"
        ' zero or is over a thousand years; `errors` names `["body", "every"]`',
    ),
    "SCHEDULE_INTERVAL_TOO_SHORT": ProblemCode(
        422,
        "Schedule interval too short",
        "a schedule's `every` shorter than `CHATEXPORT_SCHEDULE_MIN_INTERVAL_SECONDS` (a month counted"
        ' as 28 days); `errors` names `["body", "every"]`',
    ),
    "SCHEDULE_NEEDS_REPAIR": ProblemCode(
        422,
        "Schedule needs repair",
        "a resume of a schedule one of whose runs is parked in FAILED_REPAIR; an operator's requeue of"
        " the run resumes it",
    ),
    "REPLY_TARGET_NOT_FOUND": ProblemCode(
        422,
        "Reply target not found",
        "a send whose `reply_to` names no message of the conversation, or a recalled one; `errors` names"
        ' `["body", "reply_to"]`',
    ),
    "ATTACHMENT_NOT_FOUND": ProblemCode(
        422,
        "Attachment not found",
        "a send naming an attachment that the sender did not upload to the conversation, or whose upload has"
        ' not finished; `errors` names `["body", "attachments", n]`',
    ),
    "DUPLICATE_MESSAGE_ID": ProblemCode(
        409, "Duplicate message id", "a send whose `message_id` the conversation already holds, recalled or not"
    ),
    "IDEMPOTENCY_KEY_REUSED": ProblemCode(
        409,
        "Idempotency-Key reused",
        "a submit or a schedule's creation whose key was used for a different request (an export's"
        " key for a schedule, or a schedule's for an export, included)",
    ),
    "IDEMPOTENCY_KEY_EXPIRED": ProblemCode(
        409,
        "Idempotency-Key expired",
        "a submit or a schedule's creation repeating a request after the key's replay window, before"
        " its record is purged",
    ),
    "TOO_MANY_SCHEDULES": ProblemCode(
        409,
        "Too many schedules",
        "a schedule's creation by a user who already has `CHATEXPORT_MAX_SCHEDULES_PER_USER` schedules;"
        " delete one first",
    ),
    "ALREADY_TERMINAL": ProblemCode(
        409,
        "Operation already terminal",
        "a cancel of a SUCCEEDED, FAILED, FAILED_REPAIR or EXPIRED operation; with `state`",
    ),
    "NOT_REQUEUEABLE": ProblemCode(
        409, "Operation not requeueable", "an admin requeue of an operation that is not FAILED_REPAIR; with `state`"
    ),
    "RESULT_NOT_READY": ProblemCode(
        409,
        "Result not ready",
        "a download before the export SUCCEEDED (QUEUED, RUNNING, RETRY_AT, CANCEL_REQUESTED); with `state`",
    ),
    "RESULT_NOT_AVAILABLE": ProblemCode(
        409, "Result not available", "a download of a CANCELED, FAILED or FAILED_REPAIR export; with `state`"
    ),
    "RESULT_IN_PARTS": ProblemCode(
        409, "Result in parts", "`GET /v3/exports/{id}/result` of a result split into parts: download `result.parts`"
    ),
    "ACCESS_REVOKED": ProblemCode(
        403,
        "Access revoked",
        "a download, or a schedule's resume, by an owner who is no longer a member of the conversation",
    ),
    "RESULT_EXPIRED": ProblemCode(
        410, "Result expired", "a download after the result retention (EXPIRED); with `state`"
    ),
    "RANGE_NOT_SATISFIABLE": ProblemCode(
        416, "Range not satisfiable", "a download range that starts beyond the end; with `Content-Range: bytes */size`"
    ),
    "PRECONDITION_FAILED": ProblemCode(
        412, "Precondition failed", "a download whose `If-Match` or `If-Unmodified-Since` does not hold for the result"
    ),
    "TOO_MANY_UPLOADS": ProblemCode(
        429,
        "Too many uploads",
        "an attachment's upload by a user who already has `CHATEXPORT_UPLOAD_PER_USER_CONCURRENCY` open; with"
        " `Retry-After`",
    ),
    "TOO_MANY_DOWNLOADS": ProblemCode(
        429,
        "Too many downloads",
        "a download by a user who already has `CHATEXPORT_DOWNLOAD_PER_USER_CONCURRENCY` open; with `Retry-After`",
    ),
    "TOO_MANY_WAITERS": ProblemCode(
        429,
        "Too many waiting requests",
        "a long poll or event stream by a user who already has `CHATEXPORT_WAIT_PER_USER_CONCURRENCY`"
        " waiting; with `Retry-After`",
    ),
    "TOO_MANY_ACTIVE_EXPORTS": ProblemCode(
        429, "Too many active exports", "a submit over `CHATEXPORT_MAX_ACTIVE_EXPORTS`; with `Retry-After: 10`"
    ),
    "RATE_LIMITED": ProblemCode(
        429,
        "Rate limit reached",
        "a submit, poll or download over the user's policy for its window (`CHATEXPORT_RATE_LIMIT_*`); with"
        " `violated-policies` and `Retry-After`",
    ),
    "CONTENT_BYTES_SPENT": ProblemCode(
        429,
        "Storage budget spent",
        "a submit while the user's results and running exports hold `CHATEXPORT_RATE_LIMIT_CONTENT_BYTES`; with"
        " `violated-policies` and `Retry-After` (until a result expires, or 60 when none will)",
    ),
    "SERVICE_UNAVAILABLE": ProblemCode(
        503,
        "Service unavailable",
        "the database busy or restarting, every download slot of the process taken, or `/readyz` not"
        " ready (with `checks`): `Retry-After: 5`; storage unreachable on a download or an attachment's"
        " upload: `Retry-After: 30`",
    ),
    "INTERNAL": ProblemCode(
        500, "Internal server error", "an unexpected failure, or a SUCCEEDED result whose file is gone from storage"
    ),
}

NOT_FOUND_DETAIL = "The resource does not exist or you may not see it."


class ProblemError(Exception):
    """An error answered as ``application/problem+json``, whose body the model ``schemas.Problem`` describes.

    ``code`` is a key of ``CODES``; ``extra`` members (``errors``, ``state``, ...) are added to the body and
    ``headers`` to the response. ``limits`` are the user's standings the response's rate-limit fields show (a
    refusal by a policy names it; docs/api.md: Rate limits).
    """

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        limits: Sequence[Standing] = (),
        **extra: Any,
    ) -> None:
        super().__init__(code)
        self.code = code
        self.status, self.title = CODES[code].status, CODES[code].title
        self.detail = detail
        self.headers = headers or {}
        self.limits = tuple(limits)
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


def quota_exceeded(code: str, detail: str, standing: Standing, retry_after_seconds: int | None) -> ProblemError:
    """A 429 ``code`` for a spent ``standing``: ``violated-policies`` names its policy, as the quota-exceeded
    problem of draft-ietf-httpapi-ratelimit-headers does, the response's fields show it, and ``Retry-After`` is
    ``retry_after_seconds`` when waiting helps (docs/api.md: Rate limits, Refusals).
    """
    headers = {} if retry_after_seconds is None else {"Retry-After": str(retry_after_seconds)}
    return ProblemError(
        code, detail, headers=headers, limits=(standing,), **{"violated-policies": [standing.policy.name.value]}
    )


def not_found() -> ProblemError:
    """The one 404 for "does not exist" and "you may not know it exists": identical bodies (docs/api.md: Error
    codes)."""
    return ProblemError("NOT_FOUND", NOT_FOUND_DETAIL)


def validation_failed(
    errors: list[dict[str, Any]], detail: str = "The request breaks the schema.", *, error_count: int | None = None
) -> ProblemError:
    """A 422 with ``errors: [{"loc": [...], "msg": "..."}]``, the first ``MAX_LISTED_ERRORS`` of them, and
    ``error_count``: how many there are in all, ``len(errors)`` unless a caller that listed only the first
    ones says (docs/api.md: Error codes, Validation problems).
    """
    total = len(errors) if error_count is None else error_count
    return ProblemError("VALIDATION_FAILED", detail, errors=errors[:MAX_LISTED_ERRORS], error_count=total)
