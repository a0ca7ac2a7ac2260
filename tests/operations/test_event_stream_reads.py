"""An event stream outlives a read the database cannot answer (docs/api.md: Operations, Waiting for a change):
its answer has begun, so it cannot turn into a 503; it reads again at its next check and goes on.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import asyncpg

from services.api.exporting.changes import CHANGES, Change, OperationChanges, Subscription
from services.api.exporting.waiting import operation_events
from services.api.http.keys import SETTINGS
from shared.settings import Settings


class Outcomes:
    """A reader of one operation that raises or returns each of ``outcomes`` in turn."""

    key = ("op_1", "alice")

    def __init__(self, outcomes: list[Any]) -> None:
        self.outcomes = outcomes

    async def __call__(self) -> Any:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


async def test_a_read_the_database_cannot_answer_is_tried_again() -> None:
    outcomes: list[Any] = [
        asyncpg.InternalClientError("cannot switch to state 15; another operation (2) is in progress"),
        SimpleNamespace(version=2, state="SUCCEEDED"),
    ]

    # The stream asks the request only for the settings, the listener, and whether the client is still
    # connected; of the reader only its key and a read.
    settings = Settings()
    app = {SETTINGS: settings, CHANGES: OperationChanges(settings)}
    request = SimpleNamespace(app=app, transport=SimpleNamespace(is_closing=lambda: False))
    read = Outcomes(outcomes)
    subscription = Subscription()
    subscription._deliver(Change(version=2, state="SUCCEEDED"), 1)
    # Stand-ins with only what the stream reads of a request and of an operation's row.
    running: Any = SimpleNamespace(version=1, state="RUNNING")
    events = operation_events(request, read, running, subscription, last_event_id=None)  # type: ignore[arg-type]

    async with asyncio.timeout(10):
        sent = [event async for event in events]

    assert [event.version for event in sent if event is not None] == [1, 2]
    assert outcomes == []
