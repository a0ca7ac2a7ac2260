"""Waiting for an operation to end, as the API asks clients to (docs/api.md: Operations, Waiting for a change):
the event stream first; when it cannot be had or breaks, the long poll; when that is refused, plain polls
that honour ``Retry-After`` and ``next_poll_after_seconds``, with jitter so that many clients spread out.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import aiohttp

from chatexport.client.api import Api, ApiError

LONG_POLL_SECONDS = 30
# Plain polls wait what the API asks, times a random factor in this range.
JITTER = (1.0, 1.25)

Observer = Callable[[dict[str, Any]], None]


async def until_terminal(api: Api, operation: dict[str, Any], observe: Observer) -> dict[str, Any]:
    """Follow ``operation`` until it is done (``is_done``), calling ``observe`` with each representation seen;
    return the last one. Raises ``ApiError`` for a refusal that waiting longer cannot fix (401, 404).
    """
    observe(operation)
    operation_id = operation["operation_id"]
    while not is_done(operation):
        try:
            async for operation in api.events(operation_id):
                observe(operation)
        except (aiohttp.ClientError, TimeoutError, ApiError) as exc:
            _reraise_final(exc)
            operation = await _long_poll_or_poll(api, operation, observe)
    return operation


def is_done(operation: dict[str, Any]) -> bool:
    """Whether ``operation`` (a representation) is finished: its ``done`` (docs/api.md: Operations, Operation),
    or, from an API that did not show ``done`` yet, the absence of ``next_poll_after_seconds``, which it showed
    exactly while the operation was not finished.
    """
    return bool(operation.get("done", "next_poll_after_seconds" not in operation))


async def _long_poll_or_poll(api: Api, operation: dict[str, Any], observe: Observer) -> dict[str, Any]:
    try:
        operation = await api.operation(operation["operation_id"], wait_seconds=LONG_POLL_SECONDS)
    except (aiohttp.ClientError, TimeoutError, ApiError) as exc:
        _reraise_final(exc)
        await asyncio.sleep(_poll_delay(operation, exc))
        operation = await api.operation(operation["operation_id"])
    observe(operation)
    return operation


def _reraise_final(exc: BaseException) -> None:
    # Refusals about the caller or the operation itself; overload (429, 503) and outages are waited out.
    if isinstance(exc, ApiError) and exc.status in (400, 401, 403, 404, 422):
        raise exc


def _poll_delay(operation: dict[str, Any], exc: BaseException) -> float:
    asked = exc.retry_after if isinstance(exc, ApiError) and exc.retry_after else None
    seconds = asked or float(operation.get("next_poll_after_seconds") or 1)
    return seconds * random.uniform(*JITTER)
