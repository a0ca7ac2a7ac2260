"""The system a benchmark measures: started from the compose file on a database of its own, and removed
with its database, queues and exchanges afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import asyncpg

from devtools.broker import delete_broker_objects
from devtools.localsystem import LocalSystem
from devtools.servers import TcpProxy
from shared.auth import mint_token

PG_SERVER = os.environ.get("CHATEXPORT_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
AMQP_URL = os.environ.get("CHATEXPORT_BENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672/")


# Quotas no benchmark reaches: a benchmark measures the work, never a 429 (docs/api.md: Rate limits); one that
# measures the limiter itself sets its own.
NEVER_REACHED = "1000000000"
UNREACHED_RATE_LIMITS = {
    "CHATEXPORT_RATE_LIMIT_SUBMITS": NEVER_REACHED,
    "CHATEXPORT_RATE_LIMIT_POLLS": NEVER_REACHED,
    "CHATEXPORT_RATE_LIMIT_DOWNLOADS": NEVER_REACHED,
    "CHATEXPORT_RATE_LIMIT_CONTENT_BYTES": "999999999999999",
    # The open-uploads policy: bench/media.py uploads several files of one user at once.
    "CHATEXPORT_UPLOAD_PER_USER_CONCURRENCY": NEVER_REACHED,
}


@contextlib.asynccontextmanager
async def running_system(
    *, workers: int, overrides: Mapping[str, str] | None = None, template: str | None = None
) -> AsyncIterator[LocalSystem]:
    """Start every part (``workers`` workers) with ``overrides`` laid over the file's settings on a fresh
    database (a copy of the database ``template`` when given), which the compose file's one-shot ``migrate``
    brings up to date; stop and remove it all on exit.
    """
    async with proxied_system(workers=workers, overrides=overrides, template=template, proxy=False) as running:
        yield running.system


@dataclass(frozen=True)
class RunningSystem:
    """A benchmark's system and, when asked for, the proxy its parts reach S3 through."""

    system: LocalSystem
    proxy: TcpProxy | None


@contextlib.asynccontextmanager
async def proxied_system(
    *, workers: int, overrides: Mapping[str, str] | None = None, template: str | None = None, proxy: bool = True
) -> AsyncIterator[RunningSystem]:
    """``running_system``, with the parts reaching S3 through a ``TcpProxy`` in front of moto when ``proxy``
    (one the benchmark may throttle).
    """
    name = f"chatexport_bench_{uuid.uuid4().hex[:8]}"
    database_url = f"{PG_SERVER}/{name}"
    system = LocalSystem(
        database_url=database_url,
        amqp_url=AMQP_URL,
        log_dir=Path(tempfile.mkdtemp()),
        overrides={**UNREACHED_RATE_LIMITS, **(overrides or {})},
    )
    storage_proxy: TcpProxy | None = None
    try:
        if template is not None:
            await admin_execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        moto = system.start_storage()
        if proxy:
            target = urllib.parse.urlsplit(moto.endpoint_url)
            storage_proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 80)
            system.env["CHATEXPORT_S3_ENDPOINT_URL"] = f"http://127.0.0.1:{storage_proxy.port}"
        system.start_parts(workers=workers)
        yield RunningSystem(system, storage_proxy)
    finally:
        system.stop()
        if storage_proxy is not None:
            storage_proxy.close()
        await delete_broker_objects(system.settings())
        await admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def admin_execute(statement: str) -> None:
    """Run ``statement`` on the benchmark server's ``postgres`` database (to create or drop a database)."""
    await execute_on(f"{PG_SERVER}/postgres", statement)


async def execute_on(database_url: str, statement: str) -> None:
    """Run ``statement`` on a connection of its own to ``database_url``, outside any transaction (``VACUUM``)."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def admin_headers(system: LocalSystem) -> dict[str, str]:
    """An admin's ``Authorization`` for ``system``, signed with its own secret."""
    return {"Authorization": f"Bearer {mint_token(system.settings(), user_id='root', scopes=['admin'])}"}


async def member_conversation(
    api: aiohttp.ClientSession, admin: dict[str, str], *, user: str, cid: str, messages: int, body: str
) -> None:
    """Create ``cid`` with ``user`` as its only member and import ``messages`` messages of theirs, each
    ``body`` followed by its number, through the admin API.
    """
    async with api.put(f"/admin/conversations/{cid}", json={"members": [user]}, headers=admin) as response:
        assert response.status < 300, await response.text()
    lines = "".join(
        json.dumps({"message_id": f"m{n}", "sender_id": user, "body": f"{body} {n}"}) + "\n" for n in range(messages)
    )
    headers = {**admin, "Content-Type": "application/x-ndjson"}
    async with api.post(f"/admin/conversations/{cid}/messages:import", data=lines, headers=headers) as response:
        assert response.status == 200, await response.text()
