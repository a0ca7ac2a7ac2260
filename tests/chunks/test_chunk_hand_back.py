"""A worker stopped while it writes a chunk hands the chunk back (docs/kubernetes.md: Stopping and scaling down):
no attempt is spent, the lease is cleared, and another worker redoes the chunk at once, without waiting for the
lease to run out, so that a scale-down loses no work and costs no lease period.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from services.relay.main import serve as serve_relay
from services.worker.chunked.chunk import ChunkRunner
from services.worker.main import serve as serve_worker
from services.worker.writing.read_source import ReadSource
from shared.repository import chunks
from shared.repository.chunks import PlannedRange
from shared.settings import Settings
from shared.states import ChunkState
from shared.storage import CHUNK_EXTENSION, chunk_key_stem
from tests.support import wait_for
from tests.support.api_calls import Headers, import_lines, make_conversation, submit, wait_terminal
from tests.support.claims import claim

MIB = 1024 * 1024
MESSAGES = 20_000


async def test_a_chunk_handed_back_on_stop_is_redone_by_another_worker_without_a_lease_wait(
    api: Any, auth: Headers, settings: Settings, s3: Any, pool: asyncpg.Pool
) -> None:
    await make_conversation(api, auth, "c-chunks", ["alice"])
    for start in range(0, MESSAGES, 10_000):
        lines = [{"message_id": f"m{n}", "sender_id": "alice", "body": "x" * 400} for n in range(start, start + 10_000)]
        await import_lines(api, auth, "c-chunks", lines)
    # Chunks of about 2 MiB read in ranges of 500 messages, so that a chunk records progress before it ends;
    # a lease far longer than the test may wait: a takeover that waited for it would time out.
    chunked = settings.model_copy(
        update={
            "chunk_threshold_bytes": MIB,
            "chunk_target_bytes": 2 * MIB,
            "export_batch_rows": 500,
            "lease_seconds": 300.0,
            "heartbeat_seconds": 1.0,
            "shutdown_grace_seconds": 0.0,
        }
    )
    response = await submit(api, auth, "alice", "c-chunks", {"format": "jsonl"}, "hand-back-1")
    operation_id = (await response.json())["operation_id"]
    stop_relay, stop_first = asyncio.Event(), asyncio.Event()
    relay = asyncio.create_task(serve_relay(chunked, stop=stop_relay))
    first = asyncio.create_task(serve_worker(chunked, stop=stop_first))
    second: asyncio.Task[None] | None = None
    stop_second = asyncio.Event()
    try:

        async def partly_written() -> asyncpg.Record | None:
            return await pool.fetchrow(
                "SELECT chunk_no, generation FROM export_chunks"
                " WHERE operation_id = $1 AND state = 'RUNNING' AND bytes_written > 0 LIMIT 1",
                operation_id,
            )

        written = await wait_for(partly_written, timeout=60, interval=0.005)
        stop_first.set()
        await asyncio.wait_for(first, 30)

        handed_back = await pool.fetchrow(
            "SELECT state, attempts, lease_owner, lease_expires_at FROM export_chunks"
            " WHERE operation_id = $1 AND chunk_no = $2",
            operation_id,
            written["chunk_no"],
        )
        # Released by the stopped worker (a chunk of about ten ranges, stopped after its first): no attempt
        # spent, no lease left to wait for.
        assert dict(handed_back) == {"state": "PENDING", "attempts": 0, "lease_owner": None, "lease_expires_at": None}

        second = asyncio.create_task(serve_worker(chunked, stop=stop_second))
        operation = await wait_terminal(api, auth, "alice", f"/v3/operations/{operation_id}", timeout=120)
        assert operation["state"] == "SUCCEEDED", operation
        assert operation["result"]["message_count"] == MESSAGES
        redone = await pool.fetchrow(
            "SELECT state, generation FROM export_chunks WHERE operation_id = $1 AND chunk_no = $2",
            operation_id,
            written["chunk_no"],
        )
        assert redone["state"] == "DONE" and redone["generation"] > written["generation"]
    finally:
        stop_relay.set()
        stop_first.set()
        stop_second.set()
        tasks = [task for task in (relay, first, second) if task is not None]
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)


async def test_a_stop_just_after_a_chunk_is_done_keeps_its_object(
    api: Any, auth: Headers, settings: Settings, s3: Any, pool: asyncpg.Pool
) -> None:
    """The stop lands after the chunk's DONE committed, before the runner returned: handing back finds nothing
    to release, and the object the assembly will read must stay."""
    await make_conversation(api, auth, "c-done", ["alice"])
    await import_lines(
        api, auth, "c-done", [{"message_id": f"m{n}", "sender_id": "alice", "body": "x"} for n in range(4)]
    )
    response = await submit(api, auth, "alice", "c-done", {"format": "jsonl"}, "done-1")
    operation_id = (await response.json())["operation_id"]
    async with pool.acquire() as conn:
        held = await claim(conn, operation_id, "w-coordinator", lease_seconds=300)
        assert await chunks.plan(
            conn, operation_id=operation_id, generation=held.generation, ranges=[PlannedRange(0, 4, 100)]
        )
        claimed = await chunks.claim(
            conn,
            operation_id=operation_id,
            chunk_no=1,
            worker_id="w-chunk",
            lease_seconds=300,
            key_stem=chunk_key_stem(settings, operation_id, 1),
            extension=CHUNK_EXTENSION,
        )
    assert claimed is not None
    runner = ChunkRunner(pool=pool, s3=s3, settings=settings, claimed=claimed, reads=ReadSource(primary=pool))
    await runner.run()
    await runner.hand_back()

    async with pool.acquire() as conn:
        (chunk,) = await chunks.chunks_of(conn, operation_id=operation_id)
    assert chunk.state == ChunkState.DONE
    stored = await s3.head_object(Bucket=settings.s3_bucket, Key=claimed.object_key)
    assert chunk.size_bytes and stored["ContentLength"] == chunk.size_bytes
