"""The API as the client sees it: HTTP calls that answer JSON, and the problems they raise.

Nothing here imports server code: the client knows the API from its documentation alone (docs/api.md: API
reference), so it works against any deployment.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from chatexport.client.progress import Clock
from chatexport.client.ratelimit import renewal_seconds
from chatexport.client.tokens import Tokens

# Time to connect, and between two reads of an answer; a stream's heartbeats come well within it.
READ_TIMEOUT_SECONDS = 60.0


class ApiError(Exception):
    """The API answered with a problem (RFC 9457): its HTTP ``status``, stable ``code`` and ``detail``;
    ``retry_after`` in seconds when the answer carried one; ``errors``, a validation error's fields and what
    is wrong with each (``body.format: Input should be ...``).
    """

    def __init__(
        self, status: int, code: str, detail: str, retry_after: float | None = None, errors: tuple[str, ...] = ()
    ) -> None:
        super().__init__(f"{code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.retry_after = retry_after
        self.errors = errors


@dataclass(frozen=True)
class Submitted:
    """A submit's answer: the operation, and whether it replayed an earlier submit of the same key."""

    operation: dict[str, Any]
    replayed: bool


@dataclass(frozen=True)
class CreatedSchedule:
    """A schedule's creation: the schedule, and whether it replayed an earlier creation of the same key."""

    schedule: dict[str, Any]
    replayed: bool


# The largest page the API's lists answer (docs/api.md: Export schedules, Lists): a walk through all asks least.
PAGE_LIMIT = 100

# Files above this many bytes are downloaded by redirect, from the storage itself (docs/api.md: Downloads, Download by
# redirect): below it, one more round trip costs more than the API's streaming.
REDIRECT_ABOVE_BYTES = 8 * 1024 * 1024


# How many times a download from the storage is tried again within one run after its connection failed
# (docs/command-line.md: Command-line client).
STORAGE_RETRIES = 3


class Api:
    """A session on the API at ``base_url`` with the bearer ``token`` (a token, or ``Tokens`` that renew it);
    use it as an async context manager.
    Files above ``redirect_above_bytes`` are downloaded by redirect (None: never), from the storage through
    ``storage_session``, tried again up to ``storage_retries`` times when the storage's connection fails.
    ``clock`` times the renewal of a spent polls policy (``polls_renew_in``) and the waits for it.
    """

    def __init__(
        self,
        base_url: str,
        token: str | Tokens,
        *,
        redirect_above_bytes: int | None = REDIRECT_ABOVE_BYTES,
        storage_retries: int = STORAGE_RETRIES,
        clock: Clock | None = None,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self.tokens = token if isinstance(token, Tokens) else Tokens(token)
        self.redirect_above_bytes = redirect_above_bytes
        self.storage_retries = storage_retries
        self._session: aiohttp.ClientSession | None = None
        self._storage_session: aiohttp.ClientSession | None = None
        # The newest representation read of each operation, by id, with its ETag: sent back as If-None-Match,
        # so that a poll of an unchanged operation costs a 304 (docs/api.md: Operations, Conditional polls).
        self._held: dict[str, tuple[str, dict[str, Any]]] = {}
        self.clock = clock or Clock()
        # When (on ``clock``) the policies the newest answer to a poll showed spent give requests back: a poll
        # before then is refused (docs/api.md: Rate limits). None while that answer showed none spent.
        self._polls_renew_at: float | None = None

    async def __aenter__(self) -> Api:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=READ_TIMEOUT_SECONDS, sock_read=READ_TIMEOUT_SECONDS)
        # Proxies from the environment are honoured as any HTTP client honours them (trust_env).
        self._session = aiohttp.ClientSession(timeout=timeout, trust_env=True, middlewares=(self.tokens.authorize,))
        # The storage gets no credentials at all: a presigned URL is its own, and S3 refuses a request that
        # carries another. Not trusting the environment keeps ~/.netrc and a proxy's credentials away; a proxy
        # itself is still used, without them (``storage_proxy``).
        self._storage_session = aiohttp.ClientSession(timeout=timeout, trust_env=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for session in (self._session, self._storage_session):
            if session is not None:
                await session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        """The open session; raises ``RuntimeError`` outside the ``async with`` block."""
        if self._session is None:
            raise RuntimeError("Api used outside its async with block")
        return self._session

    @property
    def storage_session(self) -> aiohttp.ClientSession:
        """The open session for presigned storage URLs; raises ``RuntimeError`` outside the ``async with``."""
        if self._storage_session is None:
            raise RuntimeError("Api used outside its async with block")
        return self._storage_session

    def url(self, path: str) -> str:
        """The absolute URL of an API ``path`` such as ``/v3/operations/op_1``."""
        return f"{self._base_url}{path}"

    async def submit(self, conversation_id: str, request: dict[str, Any], *, idempotency_key: str) -> Submitted:
        """``POST /v3/conversations/{cid}/exports`` with ``idempotency_key``; raises ``ApiError``."""
        headers = {"Idempotency-Key": idempotency_key}
        async with self.session.post(
            self.url(f"/v3/conversations/{quote(conversation_id, safe='')}/exports"), json=request, headers=headers
        ) as response:
            operation = await _json(response)
            self._hold(operation, response)
            return Submitted(operation, replayed=response.headers.get("Idempotent-Replayed") == "true")

    async def operation(self, operation_id: str, *, wait_seconds: int | None = None) -> dict[str, Any]:
        """``GET /v3/operations/{id}``, a long poll of ``wait_seconds`` when given, conditional on the
        representation this session last read of it: a ``304`` returns that one again, its
        ``next_poll_after_seconds`` the answer's ``Retry-After``. Raises ``ApiError``.
        """
        params = {"wait": str(wait_seconds)} if wait_seconds else None
        held = self._held.get(operation_id)
        headers = {} if held is None else {"If-None-Match": held[0]}
        async with self.session.get(
            self.url(f"/v3/operations/{quote(operation_id, safe='')}"), params=params, headers=headers
        ) as response:
            self._note_limits(response)
            if response.status == 304 and held is not None:
                return _still_current(held[1], response.headers.get("Retry-After", ""))
            operation: dict[str, Any] = await _json(response)
            self._hold(operation, response)
            return operation

    def _hold(self, operation: dict[str, Any], response: aiohttp.ClientResponse) -> None:
        """Keep ``operation`` with the answer's ETag for the next conditional poll (``operation``)."""
        if etag := response.headers.get("ETag"):
            self._held[operation["operation_id"]] = (etag, operation)

    def polls_renew_in(self) -> float:
        """Seconds until the policies that the newest answer to a poll (a poll, a long poll, a stream's opening,
        the list of operations) showed spent give requests back, by its ``RateLimit`` field; 0 when it showed
        none spent with a time, or that time has passed (docs/api.md: Rate limits).
        """
        if self._polls_renew_at is None:
            return 0.0
        return max(0.0, self._polls_renew_at - self.clock.now())

    def _note_limits(self, response: aiohttp.ClientResponse) -> None:
        """Remember when the answer's spent policies renew (``polls_renew_in``); each answer replaces the last."""
        # A List field may come in several field lines; joined, they are the one value (RFC 9651, section 3.1).
        seconds = renewal_seconds(", ".join(response.headers.getall("RateLimit", ())))
        self._polls_renew_at = None if seconds is None else self.clock.now() + seconds

    async def operations(self, *, state: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """The caller's newest ``limit`` operations (one page), in ``state`` when given."""
        params = {"limit": str(limit), **({"state": state} if state else {})}
        async with self.session.get(self.url("/v3/operations"), params=params) as response:
            self._note_limits(response)
            page = await _json(response)
        operations: list[dict[str, Any]] = page["operations"]
        return operations

    async def cancel(self, operation_id: str) -> dict[str, Any]:
        """``POST /v3/operations/{id}/cancel``; raises ``ApiError`` (409 ``ALREADY_TERMINAL`` and others)."""
        async with self.session.post(
            self.url(f"/v3/operations/{quote(operation_id, safe='')}/cancel"), json={}
        ) as response:
            return await _json(response)

    async def create_schedule(
        self, conversation_id: str, request: dict[str, Any], *, idempotency_key: str
    ) -> CreatedSchedule:
        """``POST /v3/conversations/{cid}/export-schedules`` with ``idempotency_key`` (docs/api.md: Export
        schedules); raises ``ApiError``.
        """
        headers = {"Idempotency-Key": idempotency_key}
        async with self.session.post(
            self.url(f"/v3/conversations/{quote(conversation_id, safe='')}/export-schedules"),
            json=request,
            headers=headers,
        ) as response:
            schedule = await _json(response)
            return CreatedSchedule(schedule, replayed=response.headers.get("Idempotent-Replayed") == "true")

    def schedules(self) -> AsyncIterator[dict[str, Any]]:
        """Every schedule of the caller, newest first, page after page; raises ``ApiError``."""
        return self._walk("/v3/export-schedules", "schedules")

    async def schedule(self, schedule_id: str) -> dict[str, Any]:
        """``GET /v3/export-schedules/{id}``; raises ``ApiError`` (404 ``NOT_FOUND`` for anyone but its owner)."""
        async with self.session.get(self.url(_schedule_path(schedule_id))) as response:
            return await _json(response)

    def schedule_runs(self, schedule_id: str) -> AsyncIterator[dict[str, Any]]:
        """Every run (an operation representation) of the schedule, newest first; raises ``ApiError``."""
        return self._walk(_schedule_path(schedule_id) + "/runs", "operations")

    async def change_schedule(self, schedule_id: str, action: str) -> dict[str, Any]:
        """``POST /v3/export-schedules/{id}/{action}``, ``action`` ``pause`` or ``resume``: the schedule after it;
        raises ``ApiError`` (for a resume 422 ``SCHEDULE_NEEDS_REPAIR`` and 403 ``ACCESS_REVOKED``, and others).
        """
        async with self.session.post(self.url(f"{_schedule_path(schedule_id)}/{action}"), json={}) as response:
            return await _json(response)

    async def delete_schedule(self, schedule_id: str) -> None:
        """``DELETE /v3/export-schedules/{id}``; its runs and their results stay. Raises ``ApiError``."""
        async with self.session.delete(self.url(_schedule_path(schedule_id))) as response:
            if response.status != 204:
                raise await problem_of(response)

    async def _walk(self, path: str, key: str) -> AsyncIterator[dict[str, Any]]:
        """The items under ``key`` of every page of the list at ``path``, following ``next_cursor``."""
        params = {"limit": str(PAGE_LIMIT)}
        while True:
            async with self.session.get(self.url(path), params=params) as response:
                page = await _json(response)
            for item in page[key]:
                yield item
            if not page.get("next_cursor"):
                return
            params["cursor"] = page["next_cursor"]

    async def events(self, operation_id: str) -> AsyncIterator[dict[str, Any]]:
        """The operation's representations from ``GET /v3/operations/{id}/events`` until the stream ends;
        raises ``ApiError`` when refused and ``aiohttp.ClientError`` when the stream breaks.
        """
        async with self.session.get(self.url(f"/v3/operations/{quote(operation_id, safe='')}/events")) as response:
            self._note_limits(response)
            if response.status != 200:
                await _json(response)
            data: list[str] = []
            async for raw in response.content:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("data:"):
                    data.append(line.removeprefix("data:").removeprefix(" "))
                elif not line and data:
                    yield json.loads("\n".join(data))
                    data = []


def _still_current(operation: dict[str, Any], retry_after: str) -> dict[str, Any]:
    """A copy of ``operation`` that a ``304`` confirmed, with its ``Retry-After`` as ``next_poll_after_seconds``."""
    if retry_after.isdigit() and "next_poll_after_seconds" in operation:
        return {**operation, "next_poll_after_seconds": int(retry_after)}
    return dict(operation)


def _schedule_path(schedule_id: str) -> str:
    return f"/v3/export-schedules/{quote(schedule_id, safe='')}"


async def _json(response: aiohttp.ClientResponse) -> Any:
    """The JSON body of a 2xx answer; raises ``ApiError`` for any other."""
    if 200 <= response.status < 300:
        return await response.json()
    raise await problem_of(response)


async def problem_of(response: aiohttp.ClientResponse) -> ApiError:
    """The ``ApiError`` of an answer that is not a success, from its problem body when it has one."""
    retry_after = response.headers.get("Retry-After", "")
    seconds = float(retry_after) if retry_after.isdigit() else None
    try:
        body = await response.json(content_type=None)
        errors = tuple(".".join(map(str, error["loc"])) + f": {error['msg']}" for error in body.get("errors", ()))
        return ApiError(response.status, str(body["code"]), str(body.get("detail", "")), seconds, errors)
    except (ValueError, KeyError, TypeError, aiohttp.ContentTypeError):
        return ApiError(response.status, f"HTTP_{response.status}", response.reason or "", seconds)
