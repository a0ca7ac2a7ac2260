"""The system a benchmark measures: started from the compose file on a database of its own, and removed
with its database, queues and exchanges afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import aiohttp
import asyncpg

from devtools.broker import delete_broker_objects
from devtools.localsystem import LocalSystem
from shared.auth import mint_token

PG_SERVER = os.environ.get("CHATEXPORT_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
AMQP_URL = os.environ.get("CHATEXPORT_BENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672/")


@contextlib.asynccontextmanager
async def running_system(*, workers: int, overrides: Mapping[str, str] | None = None) -> AsyncIterator[LocalSystem]:
    """Start every part (``workers`` workers) with ``overrides`` laid over the file's settings on a fresh
    database, which the compose file's one-shot ``migrate`` creates; stop and remove it all on exit.
    """
    database_url = f"{PG_SERVER}/chatexport_bench_{uuid.uuid4().hex[:8]}"
    system = LocalSystem(
        database_url=database_url, amqp_url=AMQP_URL, log_dir=Path(tempfile.mkdtemp()), overrides=overrides
    )
    try:
        system.start(workers=workers)
        yield system
    finally:
        system.stop()
        await delete_broker_objects(system.settings())
        admin_conn = await asyncpg.connect(f"{PG_SERVER}/postgres")
        try:
            await admin_conn.execute(f'DROP DATABASE IF EXISTS "{database_url.rsplit("/", 1)[1]}" WITH (FORCE)')
        finally:
            await admin_conn.close()


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
