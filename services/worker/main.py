"""The worker's entry point: builds its resources, consumes until SIGTERM, then drains in-flight exports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import asyncpg

from services.worker.chunked.chunk import ChunkDeliveries
from services.worker.deletion_cost import keep_deletion_cost
from services.worker.operation.deliveries import OperationDeliveries
from services.worker.operation.runner import LeaseRunner
from services.worker.queue.consumer import Consumer
from services.worker.queue.members import watching_queue_members
from services.worker.writing.read_source import ReadSource
from shared import broker, tracing
from shared.db import create_pool
from shared.lifecycle import drain, keep_trying, map_large_allocations, run_until_signalled, started
from shared.logs import configure_logging
from shared.monitoring import Monitor, Unavailable, broker_check, serving_with_database, storage_check
from shared.settings import WorkerPartSettings
from shared.storage import STORAGE_ERRORS, ensure_bucket, open_s3_client

log = logging.getLogger(__name__)


# Threads of the default executor beyond one per export slot.
EXECUTOR_SPARE_THREADS = 8


async def serve(settings: WorkerPartSettings, *, stop: asyncio.Event) -> None:
    """Consume until ``stop`` is set; then stop taking work and give in-flight exports the grace period.

    Exports still running after ``shutdown_grace_seconds`` are cancelled and hand their lease back, so
    another worker takes them over at once instead of waiting for the lease to expire.
    """
    worker_id = f"{socket.gethostname()}:{os.getpid()}"
    monitor = Monitor("worker", needs=("database", "broker", "storage", "consumer"))
    async with contextlib.AsyncExitStack() as resources:
        pool = await resources.enter_async_context(serving_with_database(monitor, settings, stop=stop))
        session = await broker.open_session_when_ready(
            settings, name=f"worker {worker_id}", stop=stop, prefetch_count=settings.worker_concurrency
        )
        resources.push_async_callback(session.connection.close)
        monitor.checks["broker"] = broker_check(session.connection)
        await resources.enter_async_context(watching_queue_members(settings))
        s3 = await resources.enter_async_context(
            open_s3_client(settings, held=settings.worker_concurrency + settings.worker_chunk_concurrency)
        )
        monitor.checks["storage"] = storage_check(s3, settings.s3_bucket)
        await keep_trying(
            lambda: ensure_bucket(s3, settings.s3_bucket), what="file store", errors=STORAGE_ERRORS, stop=stop
        )
        reads = ReadSource(
            primary=pool,
            standby=await _standby_pool(settings, resources),
            wait_seconds=settings.database_read_wait_seconds,
        )
        runner = LeaseRunner(pool=pool, s3=s3, settings=settings, reads=reads)
        consumers = (
            Consumer(
                queue=session.queue,
                deliveries=OperationDeliveries(pool=pool, runner=runner, settings=settings, worker_id=worker_id),
                concurrency=settings.worker_concurrency,
            ),
            # Slots of their own: a small export never waits for a slot behind chunks (docs/chunks.md).
            Consumer(
                queue=session.chunk_queue,
                deliveries=ChunkDeliveries(pool=pool, s3=s3, settings=settings, worker_id=worker_id, reads=reads),
                concurrency=settings.worker_chunk_concurrency,
            ),
        )
        started()
        # The consumers keep the queues referenced: connect_robust restores only consumers it can still
        # reach.
        for consumer in consumers:
            consumer.start()
        monitor.checks["consumer"] = lambda: _consuming(consumers)
        log.info("worker consuming", extra={"worker": worker_id, "queue": settings.amqp_queue})
        exports, chunks = consumers
        costing = asyncio.create_task(
            keep_deletion_cost(settings, lambda: (len(exports.running), len(chunks.running)), stop=stop),
            name="pod-deletion-cost",
        )
        await stop.wait()
        await costing
        for consumer in consumers:
            consumer.close_intake()
        # The grace runs from the stop, not from the broker's answer to the consumers' cancels: a broker that is
        # slow or gone must not hold back the hand-back of what the worker holds.
        running = set().union(*(consumer.running for consumer in consumers))
        await asyncio.gather(
            drain(running, grace_seconds=settings.shutdown_grace_seconds), *(consumer.stop() for consumer in consumers)
        )


async def _standby_pool(settings: WorkerPartSettings, resources: contextlib.AsyncExitStack) -> asyncpg.Pool | None:
    """The pool of ``database_read_url``, closed with ``resources``; None when it is unset. It connects on
    first use: a standby that is down delays no start-up, and its reads go to the primary meanwhile.
    """
    if settings.database_read_url is None:
        return None
    pool = await create_pool(
        settings.model_copy(update={"database_url": settings.database_read_url}), min_size=0, writable=False
    )
    resources.push_async_callback(pool.close)
    return pool


async def _consuming(consumers: tuple[Consumer[Any], ...]) -> None:
    if not all(consumer.registered for consumer in consumers):
        raise Unavailable("no consumer registered on a queue")


def main(settings: WorkerPartSettings) -> None:
    """Run the worker until SIGINT or SIGTERM."""
    configure_logging(settings, service="worker")
    map_large_allocations()
    with tracing.traced("worker"), asyncio.Runner() as runner:
        # Each export with media holds a thread of the default executor while its ZIP is written (stream-zip
        # pulls its members across from the event loop): enough threads that exports never take every one
        # from what else needs them, such as name resolution for a new connection (docs/api.md: Submitting an
        # export, Exports with media).
        runner.get_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=settings.worker_concurrency + EXECUTOR_SPARE_THREADS)
        )
        runner.run(run_until_signalled(serve, settings))
