"""The system under fault injection: every part as a real process, S3 reached through a proxy that a test
can cut, and the invariants each fault-injection test checks at its end (issue: crashes, races and
cancellation).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from devtools.broker import delete_broker_objects
from devtools.localsystem import LocalSystem
from devtools.servers import PrivateRabbitMQ, TcpProxy
from shared.auth import mint_token
from shared.settings import Settings
from shared.states import TERMINAL, values
from shared.storage import artifact_prefix, ensure_bucket, open_s3_client
from tests.support import AMQP_URL, TEST_RATE_LIMIT_ENV, cloned_database, wait_for
from tests.support.api_calls import expected_file, metric_samples, read_all, submit

# Short leases and passes so that a takeover or a clean-up happens within seconds.
FAST: dict[str, str] = {
    **TEST_RATE_LIMIT_ENV,
    "CHATEXPORT_LEASE_SECONDS": "4",
    "CHATEXPORT_HEARTBEAT_SECONDS": "1",
    "CHATEXPORT_JANITOR_INTERVAL_SECONDS": "0.5",
    "CHATEXPORT_JANITOR_REQUEUE_AFTER_SECONDS": "2",
    "CHATEXPORT_JANITOR_ORPHAN_GRACE_SECONDS": "1",
    "CHATEXPORT_RELAY_POLL_SECONDS": "0.5",
    "CHATEXPORT_RETRY_BASE_SECONDS": "0.5",
    "CHATEXPORT_RETRY_CAP_SECONDS": "2",
    "CHATEXPORT_MAX_ATTEMPTS": "5",
    "CHATEXPORT_S3_TIMEOUT_SECONDS": "3",
    "CHATEXPORT_SHUTDOWN_GRACE_SECONDS": "5",
    "CHATEXPORT_MAX_ACTIVE_EXPORTS": "100",
    "CHATEXPORT_DATABASE_TIMEOUT_SECONDS": "3",
    "CHATEXPORT_DATABASE_CONNECT_TIMEOUT_SECONDS": "3",
}
END_TIMEOUT_SECONDS = 120.0

MIB = 1024 * 1024
# Settings for exports slow enough to act in the middle of their upload, with S3 throttled through the proxy
# to UPLOAD_BYTES_PER_SECOND: parts of the minimum size, and about three of them per export.
SLOW_UPLOADS = {
    "CHATEXPORT_S3_PART_SIZE_BYTES": str(5 * MIB),
    "CHATEXPORT_EXPORT_BATCH_ROWS": "2000",
    # A throttled part takes seconds to send: not a timeout.
    "CHATEXPORT_S3_TIMEOUT_SECONDS": "30",
}
UPLOAD_BYTES_PER_SECOND = 3 * MIB
# The conversation of about 15 MB (40,000 messages of about 300 bytes) that slow exports read, and its members.
BIG_MEMBERS = {"c-big": ["alice", "bob"]}


@dataclass
class Faulty:
    """A running system and the handles a test uses to break it and to look inside."""

    system: LocalSystem
    proxy: TcpProxy
    http: aiohttp.ClientSession
    s3: Any  # a client on moto itself, not through the proxy
    pool: asyncpg.Pool
    settings: Settings

    def auth(self, user_id: str, *, admin: bool = False) -> dict[str, str]:
        """Bearer headers for ``user_id`` signed with the system's secret."""
        token = mint_token(self.settings, user_id=user_id, scopes=["admin"] if admin else None)
        return {"Authorization": f"Bearer {token}"}

    async def submit(self, user: str, cid: str, key: str, **bounds: int) -> str:
        """Submit an export; return its operation id."""
        response = await submit(self.http, self.auth, user, cid, {"format": "jsonl", **bounds}, key)
        assert response.status == 202, await response.text()
        operation_id: str = (await response.json())["operation_id"]
        return operation_id

    async def operation(self, operation_id: str) -> asyncpg.Record:
        """The operation's row as Postgres has it now."""
        row = await self.pool.fetchrow("SELECT * FROM operations WHERE operation_id = $1", operation_id)
        assert row is not None, operation_id
        return row

    async def metrics(self, part: str) -> dict[str, float]:
        """What the process ``part`` (``worker-1``, ``janitor``...) serves on ``/metrics`` now."""
        url = f"http://127.0.0.1:{self.system.metrics_ports[part]}/metrics"
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            return metric_samples(await response.text())

    async def wait_state(self, operation_id: str, *states: str, timeout: float = END_TIMEOUT_SECONDS) -> Any:
        """Wait until the operation is in one of ``states``; return its row."""

        async def reached() -> Any:
            row = await self.operation(operation_id)
            return row if row["state"] in states else None

        return await wait_for(reached, timeout=timeout, interval=0.05)

    async def wait_ended(self, operation_id: str, timeout: float = END_TIMEOUT_SECONDS) -> Any:
        """Wait until the operation is terminal or parked (FAILED_REPAIR); return its row."""
        return await self.wait_state(operation_id, *(state.value for state in TERMINAL), timeout=timeout)

    async def objects_and_uploads(self, operation_id: str) -> tuple[set[str], set[str]]:
        """Keys of the objects and of the open multipart uploads under the operation's prefix."""
        prefix = artifact_prefix(self.settings, operation_id)
        listed = await self.s3.list_objects_v2(Bucket=self.settings.s3_bucket, Prefix=prefix)
        uploads = await self.s3.list_multipart_uploads(Bucket=self.settings.s3_bucket, Prefix=prefix)
        return {item["Key"] for item in listed.get("Contents", [])}, {
            item["Key"] for item in uploads.get("Uploads", [])
        }

    async def messages_fingerprint(self) -> str:
        """A digest of every stored message, to prove no fault changed one."""
        digest: str = await self.pool.fetchval(
            "SELECT md5(coalesce(string_agg(m::text, '|' ORDER BY conversation_id, seq), '')) FROM messages m"
        )
        return digest

    async def expected(self, user: str, cid: str, *, after_seq: int = 0, before_seq: int | None = None) -> bytes:
        """The file an export of ``cid`` must hold, built from the read API (docs/api.md: Submitting an export, The
        file)."""
        messages = await read_all(self.http, self.auth, user, cid)
        return expected_file(
            [m for m in messages if m["seq"] > after_seq and (before_seq is None or m["seq"] < before_seq)]
        )


async def check_ended_correctly(
    faulty: Faulty, owner: str, expectations: Mapping[str, bytes | str], *, fingerprint: str
) -> None:
    """The invariants every fault-injection test ends with.

    ``expectations`` maps an operation id to the file it must publish (bytes: SUCCEEDED) or to the one
    terminal state it must end in (a string). Checks: that state; a SUCCEEDED result downloads with exactly
    those bytes and its ``sha256``, and is the only object under its prefix; no object or multipart upload
    is left for any other outcome once the janitor has run; no message changed.
    """
    for operation_id, expected in expectations.items():
        row = await faulty.wait_ended(operation_id)
        if isinstance(expected, bytes):
            assert row["state"] == "SUCCEEDED", dict(row)
            await check_download(faulty, owner, row, expected)
            leftovers: tuple[set[str], set[str]] = ({row["result_key"]}, set())
        else:
            assert row["state"] == expected, dict(row)
            leftovers = (set(), set())
        await wait_for(_leaves_only(faulty, operation_id, leftovers), timeout=30)
    assert await faulty.messages_fingerprint() == fingerprint


async def ready_for_the_next_test(faulty: Faulty, members: Mapping[str, Sequence[str]]) -> None:
    """Prove that the test just ended left nothing that could leak into the next test on a system shared by a
    module's tests, then undo what a test may do on purpose (docs/development.md: Where the time goes).

    Fails when a fault of the S3 proxy is still on, a part is still frozen (SIGSTOP), or an operation or a
    chunk is not terminal within ``END_TIMEOUT_SECONDS``. Then starts again every part the test killed or
    stopped and sets each conversation of ``members`` (``{conversation_id: [user_id, ...]}``) back to those
    members.
    """
    assert not faulty.proxy.faults, f"the test left the S3 proxy {faulty.proxy.faults}"
    assert not faulty.system.group.stopped(), f"the test left {faulty.system.group.stopped()} frozen"
    await wait_for(lambda: _nothing_runs(faulty), timeout=END_TIMEOUT_SECONDS)
    faulty.system.restart_ended()
    admin = faulty.auth("root", admin=True)
    for cid, people in members.items():
        response = await faulty.http.put(f"/admin/conversations/{cid}", json={"members": list(people)}, headers=admin)
        assert response.status == 204, await response.text()


async def _nothing_runs(faulty: Faulty) -> bool:
    unended: int = await faulty.pool.fetchval(
        "SELECT (SELECT count(*) FROM operations WHERE NOT state = ANY($1::text[]))"
        " + (SELECT count(*) FROM export_chunks WHERE state = 'RUNNING')",
        values(TERMINAL),
    )
    return unended == 0


def _leaves_only(faulty: Faulty, operation_id: str, expected: tuple[set[str], set[str]]) -> Any:
    """A predicate for ``wait_for``: the operation's objects and uploads are exactly ``expected``."""

    async def check() -> bool:
        return await faulty.objects_and_uploads(operation_id) == expected

    return check


async def check_download(faulty: Faulty, owner: str, row: asyncpg.Record, expected: bytes) -> None:
    """The result downloads with exactly ``expected`` bytes, and they match the recorded sha256."""
    response = await faulty.http.get(f"/v3/exports/{row['operation_id']}/result", headers=faulty.auth(owner))
    assert response.status == 200, await response.text()
    content = await response.read()
    assert content == expected
    assert hashlib.sha256(content).hexdigest() == row["result_sha256"]
    assert row["result_message_count"] == expected.count(b"\n")


@contextlib.asynccontextmanager
async def running(
    log_dir: Path,
    *,
    database_url: str,
    amqp_url: str,
    workers: int = 2,
    janitors: int = 1,
    overrides: Mapping[str, str] | None = None,
) -> AsyncIterator[Faulty]:
    """Start moto, a proxy in front of it, and every part of the compose file with ``workers`` workers and
    ``janitors`` janitors (one by default, so that a test knows which one leads and starts any standby by
    name); stop all on exit.
    """
    system = LocalSystem(
        database_url=database_url, amqp_url=amqp_url, log_dir=log_dir, overrides={**FAST, **(overrides or {})}
    )
    proxy: TcpProxy | None = None
    try:
        moto = system.start_storage()
        direct = urllib.parse.urlsplit(moto.endpoint_url)
        proxy = TcpProxy(direct.hostname or "127.0.0.1", direct.port or 80)
        system.env["CHATEXPORT_S3_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.port}"
        settings = system.settings()
        direct_settings = settings.model_copy(update={"s3_endpoint_url": moto.endpoint_url})
        async with (
            aiohttp.ClientSession(base_url=system.base_url) as http,
            open_s3_client(direct_settings) as s3,
            asyncpg.create_pool(database_url, min_size=1, max_size=4) as pool,
        ):
            if not workers:
                # Workers create the bucket on start-up; without one the api and the janitor never get ready.
                await ensure_bucket(s3, settings.s3_bucket)
            system.start_parts(workers=workers, janitors=janitors)
            yield Faulty(system=system, proxy=proxy, http=http, s3=s3, pool=pool, settings=settings)
    finally:
        system.stop()
        if proxy is not None:
            proxy.close()
        with contextlib.suppress(Exception):
            await delete_broker_objects(system.settings())


@contextlib.asynccontextmanager
async def big_conversation_system(
    template_db: str, log_dir: Path, overrides: Mapping[str, str]
) -> AsyncIterator[Faulty]:
    """A system with two workers and ``overrides`` on a database of its own cloned from ``template_db``, holding
    the conversations of ``BIG_MEMBERS``. A module's tests share it when each ends with
    ``ready_for_the_next_test(faulty, BIG_MEMBERS)``.
    """
    async with (
        cloned_database(template_db, "chatexport_f") as database_url,
        running(log_dir, database_url=database_url, amqp_url=AMQP_URL, overrides=overrides) as system,
    ):
        for cid, members in BIG_MEMBERS.items():
            await make_conversation(system, cid, members, messages=40_000, body_bytes=300)
        yield system


async def make_conversation(faulty: Faulty, cid: str, members: list[str], *, messages: int, body_bytes: int) -> None:
    """Create ``cid`` with ``members`` and import ``messages`` messages of about ``body_bytes`` each."""
    admin = faulty.auth("root", admin=True)
    response = await faulty.http.put(f"/admin/conversations/{cid}", json={"members": members}, headers=admin)
    assert response.status == 204, await response.text()
    filler = "ü" * (body_bytes // 2)
    batch = 5000
    for start in range(0, messages, batch):
        lines = "".join(
            f'{{"message_id":"m{n}","sender_id":"{members[0]}","body":"{n} {filler}"}}\n'
            for n in range(start, min(start + batch, messages))
        )
        imported = await faulty.http.post(
            f"/admin/conversations/{cid}/messages:import",
            data=lines.encode(),
            headers={**admin, "Content-Type": "application/x-ndjson"},
        )
        assert imported.status == 200, await imported.text()


async def uploading(faulty: Faulty, operation_id: str) -> str:
    """Wait until the first attempt's multipart upload has begun; return the name of the worker holding it."""

    async def started() -> str | None:
        row = await faulty.pool.fetchrow(
            "SELECT o.lease_owner FROM operations o JOIN artifacts a USING (operation_id)"
            " WHERE o.operation_id = $1 AND o.state = 'RUNNING' AND a.generation = 1 AND a.upload_id IS NOT NULL",
            operation_id,
        )
        return None if row is None else faulty.system.holder(row["lease_owner"])

    holder: str = await wait_for(started, timeout=60)
    return holder


async def wait_for_queue_counts(
    server: PrivateRabbitMQ, queue: str, *, ready: int, unacked: int, timeout: float = 30.0
) -> None:
    """Poll the broker's figures for ``queue`` (quorum queues publish them every tick) until they are
    ``ready`` and ``unacked`` messages; fail after ``timeout`` seconds.
    """
    expected = {"messages_ready": ready, "messages_unacknowledged": unacked}

    async def settled() -> bool:
        return bool(await asyncio.to_thread(server.queue_counts, queue) == expected)

    await wait_for(settled, timeout=timeout)
