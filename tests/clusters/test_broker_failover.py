"""The system on a three-node RabbitMQ cluster (docs/deploy.md: Broker clusters): the node leading the work
queue killed under a drain, and the whole broker stopped under submits. Every part is a real process given
the three nodes' URLs; every export ends once, with the right file.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from devtools.clusters import RabbitCluster
from tests.support import cloned_database, wait_for
from tests.support.fault_harness import Faulty, check_ended_correctly, make_conversation, running

DRAIN_EXPORTS = 500
KILL_AFTER_SUCCEEDED = 100
BROKER_DOWN_SECONDS = 30.0
SUBMIT_EVERY_SECONDS = 0.5
DRAIN_TIMEOUT_SECONDS = 180.0
# The drain's quota is the whole drain (a 429 would be no broker fault); every queue is asked for a replica on
# each node.
SETTINGS = {"CHATEXPORT_MAX_ACTIVE_EXPORTS": str(DRAIN_EXPORTS + 100), "CHATEXPORT_AMQP_QUORUM_INITIAL_GROUP_SIZE": "3"}


async def succeeded(faulty: Faulty, operation_ids: Sequence[str]) -> int:
    count: int = await faulty.pool.fetchval(
        "SELECT count(*) FROM operations WHERE operation_id = ANY($1::text[]) AND state = 'SUCCEEDED'",
        list(operation_ids),
    )
    return count


async def longest_pause_seconds(faulty: Faulty, operation_ids: Sequence[str]) -> float:
    """The longest time between two consecutive exports' ends (their ``finished_at``)."""
    pause: float = await faulty.pool.fetchval(
        "SELECT coalesce(max(extract(epoch FROM gap)), 0) FROM (SELECT finished_at - lag(finished_at)"
        " OVER (ORDER BY finished_at) AS gap FROM operations WHERE operation_id = ANY($1::text[])) gaps",
        list(operation_ids),
    )
    return float(pause)


@contextlib.asynccontextmanager
async def on_the_cluster(
    rabbit_cluster: RabbitCluster, template_db: str, tmp_path: Path, cid: str
) -> AsyncIterator[tuple[Faulty, bytes, str]]:
    """Every part running on ``rabbit_cluster``, with ``cid`` (alice's, 100 messages): the system, the file an
    export of ``cid`` must hold, and the messages' fingerprint.
    """
    async with (
        cloned_database(template_db, "chatexport_c") as database_url,
        running(tmp_path, database_url=database_url, amqp_url=rabbit_cluster.amqp_url, overrides=SETTINGS) as f,
    ):
        await make_conversation(f, cid, ["alice"], messages=100, body_bytes=60)
        yield f, await f.expected("alice", cid), await f.messages_fingerprint()


async def test_a_drain_goes_on_when_the_work_queue_leader_is_killed(
    rabbit_cluster: RabbitCluster, template_db: str, tmp_path: Path
) -> None:
    async with on_the_cluster(rabbit_cluster, template_db, tmp_path, "c-drain") as (f, expected, fingerprint):
        # A queue with a replica on every node: losing its leader leaves it a majority.
        members = await asyncio.to_thread(rabbit_cluster.members_of, f.settings.amqp_queue)
        assert len(members) == len(rabbit_cluster.nodes), members
        leader = await asyncio.to_thread(rabbit_cluster.leader_of, f.settings.amqp_queue)
        exports = await asyncio.gather(*(f.submit("alice", "c-drain", f"drain-{n}") for n in range(DRAIN_EXPORTS)))
        await wait_for(lambda: _at_least(f, exports, KILL_AFTER_SUCCEEDED), timeout=DRAIN_TIMEOUT_SECONDS)
        await asyncio.to_thread(leader.stop, "kill")
        killed_at = time.monotonic()
        left = DRAIN_EXPORTS - await succeeded(f, exports)
        assert left > 0, "the drain ended before the kill: nothing was tested"
        await wait_for(lambda: _at_least(f, exports, DRAIN_EXPORTS), timeout=DRAIN_TIMEOUT_SECONDS)
        print(
            f"\ndrain of {DRAIN_EXPORTS}, the work queue's leader killed with {left} left: done"
            f" {time.monotonic() - killed_at:.1f} s after the kill; longest pause between two exports' ends"
            f" {await longest_pause_seconds(f, exports):.2f} s"
        )
        await asyncio.to_thread(leader.start)
        await check_ended_correctly(f, "alice", dict.fromkeys(exports, expected), fingerprint=fingerprint)


async def test_submits_are_accepted_while_the_whole_broker_is_down(
    rabbit_cluster: RabbitCluster, template_db: str, tmp_path: Path
) -> None:
    async with on_the_cluster(rabbit_cluster, template_db, tmp_path, "c-down") as (f, expected, fingerprint):
        before = await f.submit("alice", "c-down", "before")
        await f.wait_state(before, "SUCCEEDED")

        await asyncio.to_thread(rabbit_cluster.stop)
        during: list[str] = []
        back_at = time.monotonic() + BROKER_DOWN_SECONDS
        while time.monotonic() < back_at:  # every submit answers 202: the outbox holds the wake-ups
            during.append(await f.submit("alice", "c-down", f"during-{len(during)}"))
            await asyncio.sleep(SUBMIT_EVERY_SECONDS)  # pacing the submits, not waiting for anything
        assert await succeeded(f, during) == 0
        await asyncio.to_thread(rabbit_cluster.start)

        after = await f.submit("alice", "c-down", "after")
        outcomes: dict[str, bytes | str] = dict.fromkeys([before, *during, after], expected)
        await check_ended_correctly(f, "alice", outcomes, fingerprint=fingerprint)


async def _at_least(faulty: Faulty, operation_ids: Sequence[str], count: int) -> bool:
    return await succeeded(faulty, operation_ids) >= count
