"""Fixtures on the real servers: a Postgres template database cloned per test, unique RabbitMQ names per
test, and a moto server (S3 over real HTTP) per session.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from devtools.broker import delete_broker_objects
from devtools.moto import MotoServer, start_moto
from services.api.app import init_app
from shared.auth import mint_token
from shared.db import migrate
from shared.settings import Settings
from shared.storage import ensure_bucket, open_s3_client
from tests.support import PG_SERVER, admin_execute, cloned_database, make_settings


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    """One moto server for the session; each test has its own bucket in it."""
    server = start_moto()
    yield server
    server.stop()


@pytest.fixture(scope="session")
async def template_db() -> AsyncIterator[str]:
    """A migrated database that every test clones (procrastinate's template pattern)."""
    name = f"chatexport_tpl_{uuid.uuid4().hex[:8]}"
    await admin_execute(f'CREATE DATABASE "{name}"')
    await migrate(f"{PG_SERVER}/{name}")
    yield name
    await admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def database_url(template_db: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test, dropped afterwards."""
    async with cloned_database(template_db, "chatexport_t") as url:
        yield url


@pytest.fixture
async def settings(database_url: str, moto: MotoServer) -> AsyncIterator[Settings]:
    """This test's settings; its broker objects are deleted afterwards."""
    test_settings = make_settings(database_url, moto.endpoint_url)
    yield test_settings
    await delete_broker_objects(test_settings)


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    """A pool on this test's database."""
    test_pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=5)
    assert test_pool is not None
    yield test_pool
    await test_pool.close()


@pytest.fixture
async def s3(settings: Settings) -> AsyncIterator[Any]:
    """An S3 client on the moto server with this test's bucket created."""
    async with open_s3_client(settings) as client:
        await ensure_bucket(client, settings.s3_bucket)
        yield client


@pytest.fixture
async def api(settings: Settings, s3: Any) -> AsyncIterator[TestClient[Any, Any]]:
    """The real API application on a local port, driven over HTTP."""
    client: TestClient[Any, Any] = TestClient(TestServer(init_app(settings)))
    await client.start_server()
    yield client
    await client.close()


@pytest.fixture
def auth(settings: Settings) -> Callable[..., dict[str, str]]:
    """``auth("u-a")`` -> headers with a bearer token for user ``u-a``; ``admin=True`` adds the scope."""

    def headers(user_id: str, *, admin: bool = False) -> dict[str, str]:
        token = mint_token(settings, user_id=user_id, scopes=["admin"] if admin else None)
        return {"Authorization": f"Bearer {token}"}

    return headers
