"""The relay's callback loop outlives the database's transient errors (docs/api.md: Completion
callbacks): a batch that fails because the database restarted is tried again at the next poll, and the relay
process, whose loops share one task group, keeps running.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
import pytest

from services.relay.webhooks import WebhookSender
from shared.db import TRANSIENT_DATABASE_ERRORS
from shared.settings import Settings


class FailingFirst(WebhookSender):
    """A sender whose first batches fail with ``errors`` in turn, as a restarting database makes them fail."""

    def __init__(self, errors: list[BaseException], stop: asyncio.Event) -> None:
        # No pool: send_due, the only user of one, is replaced.
        super().__init__(pool=None, settings=Settings(relay_poll_seconds=0.01))
        self.errors, self.stop, self.batches = errors, stop, 0

    async def send_due(self) -> int:
        self.batches += 1
        if self.errors:
            raise self.errors.pop(0)
        self.stop.set()
        return 0


# What a connection broken by a restart raises mid-statement, and the other transient kinds.
BROKEN = [
    asyncpg.InternalClientError("cannot switch to state 15; another operation (2) is in progress"),
    asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    ConnectionRefusedError(111, "Connect call failed"),
    asyncpg.CannotConnectNowError("the database system is starting up"),
]


async def test_a_batch_broken_by_a_restart_is_tried_again(caplog: Any) -> None:
    assert all(isinstance(error, TRANSIENT_DATABASE_ERRORS) for error in BROKEN)
    stop = asyncio.Event()
    sender = FailingFirst(list(BROKEN), stop)

    with caplog.at_level(logging.WARNING, logger="services.relay.webhooks"):
        await asyncio.wait_for(sender.run(stop=stop), timeout=10)

    assert sender.batches == len(BROKEN) + 1
    paused = [record for record in caplog.records if record.getMessage() == "webhook deliveries paused by the database"]
    assert [record.error for record in paused] == [type(error).__name__ for error in BROKEN]


async def test_an_error_of_ours_is_not_taken_for_an_outage() -> None:
    stop = asyncio.Event()
    sender = FailingFirst([asyncpg.UndefinedColumnError("column does not exist")], stop)

    with pytest.raises(asyncpg.UndefinedColumnError):
        await asyncio.wait_for(sender.run(stop=stop), timeout=10)
