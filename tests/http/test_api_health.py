"""The API's ``/healthz`` and ``/readyz``: ready while the database answers in time, 503 while it does not."""

from __future__ import annotations

from typing import Any

import asyncpg

from devtools.moto import MotoServer
from services.api.http.keys import POOL
from shared.settings import Settings
from tests.support import PG_SERVER, refuse_connections
from tests.support.api_calls import expect_problem
from tests.support.messages import Auth, Client, configured_api


async def test_healthz_and_readyz(api: Client) -> None:
    health = await api.get("/healthz")
    ready = await api.get("/readyz")

    assert (health.status, await health.json()) == (200, {"status": "ok"})
    assert (ready.status, await ready.json()) == (
        200,
        {"status": "ready", "checks": {"database": "ok", "storage": "ok", "keys": "ok"}},
    )


async def test_readyz_reports_a_schema_past_the_range_of_this_release(api: Client, settings: Settings) -> None:
    # A later release's post migration may have removed what this one uses (docs/deploy.md: Upgrading).
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute("INSERT INTO schema_migrations (version, step) VALUES ('9999_later_removal', 'post')")
        ready = await api.get("/readyz")
        body = await ready.json()
        assert (ready.status, body["checks"]["database"]) == (503, "SchemaOutOfRange"), body
        await conn.execute("DELETE FROM schema_migrations WHERE version = '9999_later_removal'")
        assert (await api.get("/readyz")).status == 200
    finally:
        await conn.close()


async def test_readyz_and_requests_are_503_while_the_database_refuses_connections(
    api: Client, auth: Auth, settings: Settings
) -> None:
    database = settings.database_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(f"{PG_SERVER}/postgres")
    try:
        await refuse_connections(admin, database)

        refused = await api.get("/readyz")
        poll = await api.get("/v3/operations/op_whatever", headers=auth("alice"))

        await expect_problem(refused, 503, "SERVICE_UNAVAILABLE")
        await expect_problem(poll, 503, "SERVICE_UNAVAILABLE")
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()
    assert (await api.get("/readyz")).status == 200  # recovers by itself


async def test_an_api_started_while_the_database_refuses_connections_serves_once_it_is_back(
    settings: Settings, moto: MotoServer, s3: Any, auth: Auth
) -> None:
    database = settings.database_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(f"{PG_SERVER}/postgres")
    try:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        async with configured_api(settings, moto, s3_bucket=settings.s3_bucket) as client:
            await expect_problem(await client.get("/readyz"), 503, "SERVICE_UNAVAILABLE")
            await expect_problem(
                await client.get("/v3/operations/op_whatever", headers=auth("alice")), 503, "SERVICE_UNAVAILABLE"
            )
            await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
            assert (await client.get("/readyz")).status == 200
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()


async def test_readyz_is_503_when_no_connection_answers_in_time(settings: Settings, moto: MotoServer) -> None:
    async with configured_api(settings, moto, database_pool_max=1) as client:
        async with client.app[POOL].acquire():  # the only connection is busy for longer than the 2 s budget
            response = await client.get("/readyz")

        await expect_problem(response, 503, "SERVICE_UNAVAILABLE")
