"""The system on a PostgreSQL primary with a synchronous standby (docs/deploy.md: A primary with standbys): the
primary killed under a drain and the standby promoted, and a standby promoted while the old primary still
runs. Every part is a real process given both hosts with ``target_session_attrs=read-write``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from devtools.clusters import PostgresCluster
from shared.migrator import migrate
from tests.support import AMQP_URL, wait_for
from tests.support.api_calls import submit
from tests.support.fault_harness import Faulty, check_ended_correctly, make_conversation, running

MakeCluster = Callable[..., Awaitable[PostgresCluster]]
UNLIMITED = {"CHATEXPORT_MAX_ACTIVE_EXPORTS": "1000"}
LONG_POLL_SECONDS = 30


class Submitter:
    """Submits exports one after another until stopped, keeping every key that was answered 202 and the
    monotonic times of those answers; a 503 or a dropped connection is retried with the next key.
    """

    def __init__(self, faulty: Faulty, cid: str) -> None:
        self.faulty = faulty
        self.cid = cid
        self.accepted: dict[str, float] = {}  # operation id -> when the 202 came
        self.refused = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        number = 0
        while not self._stop.is_set():
            number += 1
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                response = await submit(self.faulty.http, self.faulty.auth, "alice", self.cid, {}, f"k-{number}")
                if response.status == 202:
                    self.accepted[(await response.json())["operation_id"]] = time.monotonic()
                else:
                    assert response.status == 503, await response.text()
                    self.refused += 1

    def stop(self) -> None:
        self._stop.set()


@contextlib.asynccontextmanager
async def submitting(faulty: Faulty, cid: str) -> AsyncIterator[Submitter]:
    submitter = Submitter(faulty, cid)
    task = asyncio.create_task(submitter.run())
    try:
        yield submitter
    finally:
        submitter.stop()
        await task


async def on_server(url: str, operation_ids: list[str]) -> set[str]:
    """Which of ``operation_ids`` the server at ``url`` has."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT operation_id FROM operations WHERE operation_id = ANY($1::text[])", operation_ids
        )
    finally:
        await conn.close()
    return {row["operation_id"] for row in rows}


async def long_poll_ends(faulty: Faulty, operation_id: str) -> dict[str, Any]:
    """A long poll of ``operation_id`` until it is done; each poll waits up to ``LONG_POLL_SECONDS``."""
    while True:
        response = await faulty.http.get(
            f"/v3/operations/{operation_id}", params={"wait": str(LONG_POLL_SECONDS)}, headers=faulty.auth("alice")
        )
        if response.status == 200:
            body: dict[str, Any] = await response.json()
            if body["done"]:
                return body


@contextlib.asynccontextmanager
async def on_a_synchronous_pair(
    make_postgres_cluster: MakeCluster, tmp_path: Path, cid: str
) -> AsyncIterator[tuple[PostgresCluster, Faulty]]:
    """A primary with one synchronous standby, and every part running on it with ``cid`` (alice's, 100
    messages).
    """
    cluster = await make_postgres_cluster(1, synchronous=True)
    database_url = await cluster.create_database("chatexport")
    await migrate(database_url)
    async with running(tmp_path, database_url=database_url, amqp_url=AMQP_URL, overrides=UNLIMITED) as f:
        await make_conversation(f, cid, ["alice"], messages=100, body_bytes=60)
        yield cluster, f


async def test_no_accepted_export_is_lost_when_the_primary_is_killed(
    make_postgres_cluster: MakeCluster, tmp_path: Path
) -> None:
    async with on_a_synchronous_pair(make_postgres_cluster, tmp_path, "c-fail") as (cluster, f):
        expected = await f.expected("alice", "c-fail")
        fingerprint = await f.messages_fingerprint()
        async with submitting(f, "c-fail") as submitter:
            await wait_for(lambda: len(submitter.accepted) >= 50, timeout=120)
            old_primary, standby = cluster.primary, cluster.standbys[0]
            await asyncio.to_thread(old_primary.stop, "immediate")  # a crash: no checkpoint, clients cut off
            killed_at = time.monotonic()
            await asyncio.to_thread(cluster.promote, standby)
            first = await wait_for(
                lambda: min((t for t in submitter.accepted.values() if t > killed_at), default=0), timeout=120
            )
            await wait_for(lambda: sum(t > killed_at for t in submitter.accepted.values()) >= 20, timeout=120)
        print(
            f"\nfailover: first 202 from the new primary {first - killed_at:.1f} s after the kill;"
            f" {len(submitter.accepted)} accepted, {submitter.refused} answered 503"
        )
        accepted = list(submitter.accepted)
        assert await on_server(cluster.server_url(standby, "chatexport"), accepted) == set(accepted)
        last = accepted[-1]
        assert (await long_poll_ends(f, last))["state"] == "SUCCEEDED"
        await check_ended_correctly(f, "alice", dict.fromkeys(accepted, expected), fingerprint=fingerprint)


async def test_an_unfenced_old_primary_answers_503_never_202(
    make_postgres_cluster: MakeCluster, tmp_path: Path
) -> None:
    async with on_a_synchronous_pair(make_postgres_cluster, tmp_path, "c-split") as (cluster, f):
        old_primary, standby = cluster.primary, cluster.standbys[0]
        await asyncio.to_thread(cluster.promote, standby)
        # The old primary still takes the parts' writes, but no standby confirms them any more.
        during = await asyncio.gather(*(submit(f.http, f.auth, "alice", "c-split", {}, f"split-{n}") for n in range(3)))
        assert [response.status for response in during] == [503, 503, 503]
        await asyncio.to_thread(old_primary.stop, "immediate")
        retried = await asyncio.gather(
            *(submit(f.http, f.auth, "alice", "c-split", {}, f"split-{n}") for n in range(3))
        )
        assert [response.status for response in retried] == [202, 202, 202]
        accepted = [(await response.json())["operation_id"] for response in retried]
        assert await on_server(cluster.server_url(standby, "chatexport"), accepted) == set(accepted)
        for operation_id in accepted:
            assert (await long_poll_ends(f, operation_id))["state"] == "SUCCEEDED"
