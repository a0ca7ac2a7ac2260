"""A worker stopped in the middle of an export hands its lease back: no attempt is spent and another
worker can take the operation over at once (docs/states.md: States and failure model).
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from services.relay.main import serve as serve_relay
from services.worker.main import serve as serve_worker
from shared.settings import Settings
from tests.support import wait_for
from tests.support.api_calls import Headers, import_lines, make_conversation, submit


async def test_a_stopped_worker_hands_its_lease_back(
    api: Any, auth: Headers, settings: Settings, s3: Any, pool: asyncpg.Pool
) -> None:
    await make_conversation(api, auth, "c-stop", ["alice"])
    for start in range(0, 60_000, 20_000):
        lines = [{"message_id": f"m{n}", "sender_id": "alice", "body": "x" * 400} for n in range(start, start + 20_000)]
        await import_lines(api, auth, "c-stop", lines)
    response = await submit(api, auth, "alice", "c-stop", {"format": "jsonl"}, "stop-1")
    operation_id = (await response.json())["operation_id"]

    # One range for the whole conversation: the stop lands while Postgres streams it (asyncpg then raises
    # its own error rather than CancelledError). No grace: cancel at once.
    worker_settings = settings.model_copy(update={"export_batch_rows": 100_000, "shutdown_grace_seconds": 0.0})
    stop_relay, stop_worker = asyncio.Event(), asyncio.Event()
    relay = asyncio.create_task(serve_relay(settings, stop=stop_relay))
    worker = asyncio.create_task(serve_worker(worker_settings, stop=stop_worker))
    try:

        async def streaming() -> bool:
            # The artifact is recorded just before the first range is read.
            found = await pool.fetchval("SELECT count(*) FROM artifacts WHERE operation_id = $1", operation_id)
            return bool(found)

        await wait_for(streaming, timeout=30, interval=0.005)
        stop_worker.set()
        await asyncio.wait_for(worker, 30)

        row = await pool.fetchrow(
            "SELECT state, attempt, generation, progress_phase, lease_expires_at < now() AS lease_over,"
            " error_code FROM operations WHERE operation_id = $1",
            operation_id,
        )
        assert row is not None
        assert dict(row) == {
            "state": "RUNNING",
            "attempt": 0,
            "generation": 1,
            "progress_phase": "handed back",
            "lease_over": True,
            "error_code": None,
        }
        assert await pool.fetchval("SELECT count(*) FROM outbox WHERE operation_id = $1", operation_id) == 2
    finally:
        stop_relay.set()
        stop_worker.set()
        await asyncio.wait_for(asyncio.gather(relay, worker, return_exceptions=True), 30)
