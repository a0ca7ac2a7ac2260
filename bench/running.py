"""The system a benchmark measures: started from the compose file on a database of its own, and removed
with its database, queues and exchanges afterwards.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import asyncpg

from devtools.broker import delete_broker_objects
from devtools.localsystem import LocalSystem

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
