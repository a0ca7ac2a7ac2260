"""Waiting for an operation to end, as the API asks clients to (docs/api.md: Operations, Waiting for a change):
the event stream first; when it cannot be had or breaks, the long poll; when that is refused, plain polls
that honour ``Retry-After`` and ``next_poll_after_seconds``, with jitter so that many clients spread out.
None of them goes out before a 429's ``Retry-After`` has passed, nor while a policy that the newest answer's
``RateLimit`` field showed spent has not renewed (docs/api.md: Rate limits).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import aiohttp

from chatexport.client.api import Api, ApiError

LONG_POLL_SECONDS = 30
# Waits are what the API asks, times a random factor in this range: never shorter than asked.
JITTER = (1.0, 1.25)

Observer = Callable[[dict[str, Any]], None]


async def until_terminal(api: Api, operation: dict[str, Any], observe: Observer) -> dict[str, Any]:
    """Follow ``operation`` until it is done (``is_done``), calling ``observe`` with each representation seen;
    return the last one. Waits on ``api.clock``. Raises ``ApiError`` for a refusal that waiting longer cannot
    fix (401, 404); a 429 with ``Retry-After`` is waited out.
    """
    observe(operation)
    operation_id = operation["operation_id"]
    while not is_done(operation):
        await _when_allowed(api)
        try:
            async for operation in api.events(operation_id):
                observe(operation)
        except (aiohttp.ClientError, TimeoutError, ApiError) as exc:
            _reraise_final(exc)
            operation = await _long_poll_or_poll(api, operation, observe, exc)
    return operation


def is_done(operation: dict[str, Any]) -> bool:
    """Whether ``operation`` (a representation) is finished: its ``done`` (docs/api.md: Operations, Operation),
    or, from an API that did not show ``done`` yet, the absence of ``next_poll_after_seconds``, which it showed
    exactly while the operation was not finished.
    """
    return bool(operation.get("done", "next_poll_after_seconds" not in operation))


async def _long_poll_or_poll(
    api: Api, operation: dict[str, Any], observe: Observer, failure: BaseException
) -> dict[str, Any]:
    operation_id = operation["operation_id"]
    # The stream counts as a poll: its 429, or a policy its opening showed spent, holds for the long poll too.
    await _when_allowed(api, failure)
    try:
        operation = await api.operation(operation_id, wait_seconds=LONG_POLL_SECONDS)
    except (aiohttp.ClientError, TimeoutError, ApiError) as exc:
        _reraise_final(exc)
        failure = exc
        while True:
            await api.clock.sleep(poll_delay(operation, failure, api.polls_renew_in()))
            try:
                operation = await api.operation(operation_id)
                break
            except ApiError as refused:
                if _retry_after_429(refused) is None:
                    raise
                failure = refused
    observe(operation)
    return operation


async def _when_allowed(api: Api, failure: BaseException | None = None) -> None:
    """Return once a 429 ``failure``'s ``Retry-After`` has passed and the policies the newest answer showed spent
    have renewed (``Api.polls_renew_in``), with jitter; at once when neither holds anything back.
    """
    if seconds := max(_retry_after_429(failure) or 0.0, api.polls_renew_in()):
        await api.clock.sleep(jittered(seconds))


def _reraise_final(exc: BaseException) -> None:
    # Refusals about the caller or the operation itself; overload (429, 503) and outages are waited out.
    if isinstance(exc, ApiError) and exc.status in (400, 401, 403, 404, 422):
        raise exc


def _retry_after_429(exc: BaseException | None) -> float | None:
    # A 429 that says when (RATE_LIMITED, TOO_MANY_WAITERS, ...): the same request is worth asking again then.
    return exc.retry_after if isinstance(exc, ApiError) and exc.status == 429 else None


def poll_delay(operation: dict[str, Any], failure: BaseException, renews_in: float) -> float:
    """Seconds to wait before polling ``operation`` again after ``failure``: the ``Retry-After`` of a refusal
    that gave one, else the operation's ``next_poll_after_seconds`` (1 without it); never less than
    ``renews_in``, the seconds until the policies the newest answer showed spent renew (``Api.polls_renew_in``;
    docs/api.md: Rate limits); plus jitter (``jittered``).
    """
    asked = failure.retry_after if isinstance(failure, ApiError) and failure.retry_after else None
    seconds = asked or float(operation.get("next_poll_after_seconds") or 1)
    return jittered(max(seconds, renews_in))


def jittered(seconds: float) -> float:
    """``seconds`` times a random factor in ``JITTER``: never less, so that a wait the API asks for holds, and
    more by up to a quarter, so that clients refused together do not all come back at once."""
    return seconds * random.uniform(*JITTER)
