"""The API's listener for operation changes (docs/api.md: Operations, Waiting for a change) outlives a database
that refuses its connections for a while, whatever the refusal, and listens again once it is allowed; waiters
woken together share one read of their operation.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from services.api.exporting.changes import CHANNEL, OperationChanges
from shared.settings import Settings
from tests.support import PG_SERVER, refuse_connections, wait_for


async def test_the_listener_listens_again_after_the_database_refused_connections(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    database = settings.database_url.rsplit("/", 1)[1]
    changes = OperationChanges(settings)
    await changes.start()
    admin = await asyncpg.connect(f"{PG_SERVER}/postgres")
    try:
        await wait_for(lambda: changes.connected)
        # "database is not accepting connections" (SQLSTATE 55000), not the refusal of a restart.
        await refuse_connections(admin, database)
        with caplog.at_level(logging.WARNING, logger="services.api.exporting.changes"):
            await wait_for(lambda: "operation changes unavailable" in caplog.text, timeout=30)
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')

        await wait_for(lambda: changes.connected, timeout=30)
        with changes.subscribe("op_listened") as subscription:
            await wait_for(lambda: changes.listening)
            notifier = await asyncpg.connect(settings.database_url)
            try:
                await notifier.execute(f"SELECT pg_notify('{CHANNEL}', 'op_listened 7 RUNNING')")
            finally:
                await notifier.close()
            await wait_for(lambda: subscription.latest is not None, timeout=10)
        assert subscription.latest is not None and subscription.latest.version == 7
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()
        await changes.close()


async def listen_statement(conn: asyncpg.Connection) -> str | None:
    """The last LISTEN or UNLISTEN of the operation changes' channel another session of the database sent."""
    found: str | None = await conn.fetchval(
        "SELECT query FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND query LIKE $1",
        f'%LISTEN "{CHANNEL}"',
    )
    return found


async def test_the_listener_listens_only_while_it_has_waiters(settings: Settings) -> None:
    changes = OperationChanges(settings, linger_seconds=0.2)
    await changes.start()
    conn = await asyncpg.connect(settings.database_url)
    try:
        await wait_for(lambda: changes.connected)
        assert not changes.listening and await listen_statement(conn) is None
        with changes.subscribe("op_waited") as subscription:
            await wait_for(lambda: changes.listening)
            # What was announced before the LISTEN took effect never reached the process: it reads again.
            assert subscription.missed
            assert await listen_statement(conn) == f'LISTEN "{CHANNEL}"'
            await conn.execute(f"SELECT pg_notify('{CHANNEL}', 'op_waited 3 RUNNING')")
            await wait_for(lambda: subscription.latest is not None)
        assert subscription.latest is not None and subscription.latest.version == 3
        await wait_for(lambda: not changes.listening)

        async def unlistened() -> bool:
            return await listen_statement(conn) == f'UNLISTEN "{CHANNEL}"'

        await wait_for(unlistened)
    finally:
        await conn.close()
        await changes.close()


class CountedRead:
    """A read that counts its calls and returns the call's number once ``release`` is set."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()

    async def __call__(self) -> int:
        self.calls += 1
        number = self.calls
        await self.release.wait()
        return number


async def test_waiters_woken_together_share_one_read(settings: Settings) -> None:
    changes, read = OperationChanges(settings), CountedRead()
    readers = [asyncio.create_task(changes.read("op", read, after=0)) for _ in range(1000)]
    await wait_for(lambda: read.calls == 1)
    read.release.set()
    assert await asyncio.gather(*readers) == [1] * 1000
    assert read.calls == 1


async def test_a_read_that_began_before_a_wake_up_is_not_handed_to_its_waiter(settings: Settings) -> None:
    changes, read = OperationChanges(settings), CountedRead()
    with changes.subscribe("op") as subscription:
        early = asyncio.create_task(changes.read("op", read, after=subscription.woken_at))
        await wait_for(lambda: read.calls == 1)
        # The change committed after the early read began: that read may not show it.
        changes._on_notification(None, 0, CHANNEL, "op 2 RUNNING")
        late = asyncio.create_task(changes.read("op", read, after=subscription.woken_at))
        await wait_for(lambda: read.calls == 2)
        read.release.set()
        assert (await early, await late) == (1, 2)


async def test_a_waiter_that_goes_does_not_cancel_the_read_the_others_share(settings: Settings) -> None:
    changes, read = OperationChanges(settings), CountedRead()
    leaving = asyncio.create_task(changes.read("op", read, after=0))
    staying = asyncio.create_task(changes.read("op", read, after=0))
    await wait_for(lambda: read.calls == 1)
    leaving.cancel()
    read.release.set()
    assert await staying == 1
