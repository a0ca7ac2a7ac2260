"""The command-line client waits until the API says an operation is done (docs/api.md: Operations, Operation;
Command-line client): it knows no list of terminal states, so a state it has never heard of ends the wait
when the representation says ``done``, and keeps it going when it does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

from chatexport.client.api import Api
from chatexport.client.progress import Clock
from chatexport.client.waiting import is_done, until_terminal


class StreamingApi:
    """An API whose event stream sends ``representations``, then ends as a finished stream does; no answer of it
    shows a policy spent.
    """

    def __init__(self, representations: list[dict[str, Any]]) -> None:
        self._representations = representations
        self.clock = Clock()

    def polls_renew_in(self) -> float:
        return 0.0

    async def events(self, operation_id: str) -> AsyncIterator[dict[str, Any]]:
        await asyncio.sleep(0)  # a real stream reads the network
        for representation in self._representations:
            yield representation
        self._representations = []


def operation(state: str, **members: Any) -> dict[str, Any]:
    return {"operation_id": "op_1", "state": state, **members}


async def test_the_wait_ends_when_the_api_says_done_whatever_the_state() -> None:
    seen: list[str] = []
    api = StreamingApi([operation("PAUSED", done=False), operation("ARCHIVED", done=True)])
    async with asyncio.timeout(5):
        last = await until_terminal(cast(Api, api), operation("QUEUED", done=False), lambda o: seen.append(o["state"]))
    assert (last["state"], seen) == ("ARCHIVED", ["QUEUED", "PAUSED", "ARCHIVED"])


def test_done_is_the_representation_s_and_next_poll_from_an_api_without_it() -> None:
    assert is_done(operation("FAILED_REPAIR", done=True))
    assert not is_done(operation("QUEUED", done=False, next_poll_after_seconds=1))
    # An API from before `done` showed next_poll_after_seconds exactly while the operation was not finished.
    assert not is_done(operation("RUNNING", next_poll_after_seconds=2))
    assert is_done(operation("SUCCEEDED"))
