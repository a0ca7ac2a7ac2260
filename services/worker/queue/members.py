"""The member check of the quorum queues (docs/deploy.md: Broker clusters).

A quorum queue declared before its RabbitMQ cluster formed keeps a replica on one node only (rabbitmq-server
#3850): losing that node stops the queue, however many nodes are left. Nothing over AMQP tells it, so the
worker asks the management API, at start-up and then every ``MEMBER_CHECK_INTERVAL_SECONDS``: it exports
the member counts and logs a WARNING while a queue has fewer members than
``amqp_quorum_initial_group_size``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import aiohttp

from services.worker import metrics
from shared import broker
from shared.settings import WorkerPartSettings

log = logging.getLogger(__name__)

# Members change only when an operator adds, removes or grows nodes: a minute is soon enough to see it.
MEMBER_CHECK_INTERVAL_SECONDS = 60.0
# What a member check may fail with; the next check tries again.
MEMBER_CHECK_ERRORS = (aiohttp.ClientError, TimeoutError, ValueError, broker.MembersUnknown)


async def check_queue_members(settings: WorkerPartSettings, counts: dict[str, int]) -> None:
    """Ask for the members of each of our quorum queues and set ``chatexport_broker_queue_members``; log a
    WARNING for a queue with fewer than ``amqp_quorum_initial_group_size`` when its count differs from the
    one in ``counts`` (queue name -> members at the previous check, updated here), so a short queue is told
    at start-up and again only when it changes. A queue whose check fails is logged and left as it was.
    """
    wanted = settings.amqp_quorum_initial_group_size
    for queue in broker.queue_names(settings):
        try:
            members = await broker.queue_members(settings, queue)
        except MEMBER_CHECK_ERRORS as exc:
            log.warning("queue members unknown", extra={"queue": queue, "error": type(exc).__name__})
            continue
        metrics.BROKER_QUEUE_MEMBERS.labels(queue).set(len(members))
        previous = counts.get(queue)
        counts[queue] = len(members)
        if wanted is not None and len(members) < wanted and previous != len(members):
            log.warning(
                "quorum queue has fewer members than wanted; add them with `rabbitmq-queues grow <node> all`",
                extra={"queue": queue, "members": members, "wanted": wanted},
            )


async def watch_queue_members(settings: WorkerPartSettings) -> None:
    """``check_queue_members`` now and every ``MEMBER_CHECK_INTERVAL_SECONDS``, until cancelled."""
    if settings.amqp_quorum_initial_group_size is not None:
        metrics.BROKER_QUEUE_MEMBERS_WANTED.set(settings.amqp_quorum_initial_group_size)
    counts: dict[str, int] = {}
    while True:
        await check_queue_members(settings, counts)
        await asyncio.sleep(MEMBER_CHECK_INTERVAL_SECONDS)


@contextlib.asynccontextmanager
async def watching_queue_members(settings: WorkerPartSettings) -> AsyncIterator[None]:
    """Run ``watch_queue_members`` in a task while inside, when ``amqp_management_url`` is set; else nothing.
    On leaving, a check in flight is cancelled: shutdown never waits for the management API.
    """
    if settings.amqp_management_url is None:
        yield
        return
    task = asyncio.create_task(watch_queue_members(settings), name="queue-member-check")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
