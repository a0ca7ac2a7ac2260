"""The janitor and chunked exports (docs/chunks.md: The janitor and chunks), on real Postgres and a moto
server: a finished chunk's object outlives the grace period while its export runs or is parked, a running
chunk's upload is never aborted, and what a superseded chunk generation or an ended export left is removed.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from services.janitor.janitor import Janitor
from services.janitor.metrics import observe_system
from shared.settings import Settings
from tests.support import wait_for
from tests.support.bucket import all_keys, older_than_grace, put, start_upload, uploads
from tests.support.rows import insert_operation, shift

# Long enough that an object written just before a pass is still younger (S3 times are whole seconds).
GRACE_SECONDS = 3.0


@pytest.fixture
def janitor(pool: asyncpg.Pool, s3: Any, settings: Settings) -> Janitor:
    return Janitor(
        pool=pool, s3=s3, settings=settings.model_copy(update={"janitor_orphan_grace_seconds": GRACE_SECONDS})
    )


async def insert_chunk(pool: asyncpg.Pool, operation_id: str, chunk_no: int, state: str, generation: int) -> str:
    """A chunk of ``operation_id`` in ``state`` whose current generation is ``generation``; its key."""
    key = f"exports/{operation_id}/chunks/{chunk_no}-g{generation}.part"
    await pool.execute(
        "INSERT INTO export_chunks (operation_id, chunk_no, after_seq, last_seq, estimated_bytes, state, generation,"
        " object_key, lease_owner, lease_expires_at)"
        " VALUES ($1, $2, $2 * 10 - 10, $2 * 10, 100, $3, $4, $5, CASE WHEN $3 = 'RUNNING' THEN 'w:1' END,"
        " CASE WHEN $3 = 'RUNNING' THEN now() + interval '1 minute' END)",
        operation_id,
        chunk_no,
        state,
        generation,
        key,
    )
    return key


async def test_a_running_exports_chunks_stay_and_superseded_or_ended_ones_go(
    janitor: Janitor,
    pool: asyncpg.Pool,
    s3: Any,
    settings: Settings,
) -> None:
    await insert_operation(pool, "op_live", "RUNNING", generation=1)
    await shift(pool, "op_live", "lease_expires_at", "1 minute")
    finished = await put(s3, settings, await insert_chunk(pool, "op_live", 1, "DONE", 1))
    running = await insert_chunk(pool, "op_live", 2, "RUNNING", 2)
    running_upload = await start_upload(s3, settings, running)
    superseded = await put(s3, settings, "exports/op_live/chunks/2-g1.part")
    superseded_upload = await start_upload(s3, settings, "exports/op_live/chunks/2-g1.part")
    await insert_operation(pool, "op_parked", "FAILED_REPAIR", generation=1)
    parked = await put(s3, settings, await insert_chunk(pool, "op_parked", 1, "DONE", 1))
    await insert_operation(pool, "op_ended", "SUCCEEDED", generation=1)
    ended = await put(s3, settings, await insert_chunk(pool, "op_ended", 1, "DONE", 1))
    await wait_for(lambda: older_than_grace(s3, settings, GRACE_SECONDS), timeout=GRACE_SECONDS + 10)

    report = await janitor.run_pass()

    assert await all_keys(s3, settings) == {finished, parked}
    assert superseded not in await all_keys(s3, settings) and ended not in await all_keys(s3, settings)
    assert await uploads(s3, settings) == {running_upload}
    assert superseded_upload not in await uploads(s3, settings)
    assert report.orphan_objects_removed == 2

    await observe_system(pool)
    # op_live's and op_parked's finished chunks, op_live's running one.
    assert REGISTRY.get_sample_value("chatexport_export_chunks", {"state": "DONE"}) == 2
    assert REGISTRY.get_sample_value("chatexport_export_chunks", {"state": "RUNNING"}) == 1
