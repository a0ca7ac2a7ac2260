"""The API's listener for operation changes (docs/api.md: API reference, Waiting for a change) outlives a database
that refuses its connections for a while, whatever the refusal, and listens again once it is allowed.
"""

from __future__ import annotations

import logging

import asyncpg
import pytest

from services.api.exporting.changes import CHANNEL, OperationChanges
from shared.settings import Settings
from tests.support import PG_SERVER, wait_for


async def test_the_listener_listens_again_after_the_database_refused_connections(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    database = settings.database_url.rsplit("/", 1)[1]
    changes = OperationChanges(settings)
    await changes.start()
    admin = await asyncpg.connect(f"{PG_SERVER}/postgres")
    try:
        await wait_for(lambda: changes.listening)
        # "database is not accepting connections" (SQLSTATE 55000), not the refusal of a restart.
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", database)
        with caplog.at_level(logging.WARNING, logger="services.api.exporting.changes"):
            await wait_for(lambda: "operation changes unavailable" in caplog.text, timeout=30)
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')

        await wait_for(lambda: changes.listening, timeout=30)
        with changes.subscribe("op_listened") as subscription:
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
