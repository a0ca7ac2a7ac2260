"""Fixtures on the real servers: a Postgres template database cloned per test, unique RabbitMQ names per
test, and a moto server (S3 over real HTTP) per session.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
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

PG_SERVER = os.environ.get("CHATEXPORT_TEST_PG", "postgresql://postgres@127.0.0.1:5432")
AMQP_URL = os.environ.get("CHATEXPORT_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")


def unique(prefix: str) -> str:
    """A name no other test uses: ``prefix-<12 hex>``."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def _admin_execute(sql: str) -> None:
    conn = await asyncpg.connect(f"{PG_SERVER}/postgres")
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


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
    await _admin_execute(f'CREATE DATABASE "{name}"')
    await migrate(f"{PG_SERVER}/{name}")
    yield name
    await _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.asynccontextmanager
async def cloned_database(template_db: str, prefix: str) -> AsyncIterator[str]:
    """Yield the URL of a new clone of ``template_db`` named ``<prefix>_<hex>``; dropped on exit."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    await _admin_execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    try:
        yield f"{PG_SERVER}/{name}"
    finally:
        await _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def database_url(template_db: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test, dropped afterwards."""
    async with cloned_database(template_db, "chatexport_t") as url:
        yield url


def make_settings(database_url: str, s3_endpoint_url: str, **overrides: Any) -> Settings:
    """Settings for one test: its own database, bucket, exchange and queue; short timings."""
    values: dict[str, Any] = {
        "environment": "development",
        "database_url": database_url,
        "amqp_url": AMQP_URL,
        "amqp_exchange": unique("chatexport-test"),
        "amqp_queue": unique("chatexport-test"),
        "s3_endpoint_url": s3_endpoint_url,
        "s3_bucket": unique("bucket"),
        "lease_seconds": 5.0,
        "heartbeat_seconds": 1.0,
        "relay_poll_seconds": 0.2,
        "janitor_interval_seconds": 0.5,
        "shutdown_grace_seconds": 5.0,
        "metrics_port": 0,  # a free port each: tests run many parts side by side
    }
    values.update(overrides)
    return Settings(**values)


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


async def wait_for(predicate: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Poll ``predicate`` (sync or async) until it returns a truthy value; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)
