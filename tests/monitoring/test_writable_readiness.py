"""Readiness of a part that writes, on a database that takes no writes (docs/operations.md: A database that
takes no writes): a primary made read-only is reproduced on the real Postgres with
``default_transaction_read_only``, on this test's own database, never on the server's configuration.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from services.api.app import init_app
from shared.db import ReadOnlyServer, create_pool
from shared.monitoring import Monitor, database_check
from shared.settings import Settings
from tests.support import admin_execute


async def make_read_only(settings: Settings) -> None:
    """What ``ALTER SYSTEM`` would do to a whole primary, for this test's database only (new sessions)."""
    name = settings.database_url.rsplit("/", 1)[1]
    await admin_execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')


async def test_a_session_on_a_server_made_read_only_is_not_ready(settings: Settings) -> None:
    # A session opened while the server took writes, which then stopped: the pool's connections are old.
    monitor = Monitor("test", needs=("database",))
    async with asyncpg.create_pool(
        settings.database_url, min_size=1, max_size=1, server_settings={"default_transaction_read_only": "on"}
    ) as pool:
        monitor.checks["database"] = database_check(pool)
        assert await monitor.readiness() == {"database": "ReadOnlyServer"}


async def test_a_pool_on_a_read_only_database_opens_no_connection_and_is_not_ready(settings: Settings) -> None:
    await make_read_only(settings)
    monitor = Monitor("test", needs=("database",))
    pool = await create_pool(settings, min_size=0)
    try:
        monitor.checks["database"] = database_check(pool)
        assert await monitor.readiness() == {"database": "ReadOnlyServer"}
        with pytest.raises(ReadOnlyServer):
            await pool.acquire()
    finally:
        await pool.close()


async def test_the_apis_readiness_names_the_read_only_database(settings: Settings, s3: Any) -> None:
    await make_read_only(settings)
    async with TestClient(TestServer(init_app(settings))) as client:
        response = await client.get("/readyz")
        body = await response.json(content_type=None)
    assert response.status == 503
    assert body["checks"]["database"] == "ReadOnlyServer"
