"""Two releases on one database, one broker and one bucket, as an upgrade runs them (docs/deploy.md: Upgrading,
The live upgrade test): the previous release's parts (``devtools.releases``) under traffic, this release's
parts started beside them, and the checks every leg ends with.

The traffic goes on through every step: exports of a small, a big and a chunked conversation submitted
through each api that runs, some with a completion callback, each polled through another api, some
cancelled through another, each finished one downloaded through another; an incremental schedule fires
every few seconds on a conversation that keeps growing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from devtools.broker import delete_broker_objects
from devtools.localsystem import LocalSystem
from devtools.moto import MotoServer, start_moto
from devtools.releases import Release
from shared.broker import connect, dead_queue_name
from shared.states import TERMINAL, values
from shared.storage import open_s3_client
from tests.support import AMQP_URL, PG_SERVER, admin_execute, wait_for
from tests.support.api_calls import expected_file, import_lines, make_conversation, read_all, submit
from tests.support.e2e import headers_for
from tests.support.fault_harness import FAST
from tests.support.webhook_peers import Receiver, listening

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# Both releases read these (a setting one of them does not know is ignored by it).
SETTINGS = {
    **FAST,
    "CHATEXPORT_ENVIRONMENT": "development",  # for the short schedule interval and the local receiver
    "CHATEXPORT_WEBHOOK_ALLOW_PRIVATE": "true",
    "CHATEXPORT_SCHEDULE_MIN_INTERVAL_SECONDS": "1",
    "CHATEXPORT_SCHEDULER_INTERVAL_SECONDS": "0.5",
    "CHATEXPORT_JANITOR_INTERVAL_SECONDS": "1",
    # A chunked export of several chunks, and a big one written in several ranges.
    "CHATEXPORT_CHUNK_THRESHOLD_BYTES": str(MIB),
    "CHATEXPORT_CHUNK_TARGET_BYTES": str(MIB // 4),
    "CHATEXPORT_EXPORT_BATCH_ROWS": "500",
}
OWNER = "alice"
# conversation -> messages of about 200 bytes: small, big (under the chunk threshold) and chunked (over it)
CONVERSATIONS = {"c-small": 30, "c-big": 4_000, "c-chunked": 12_000}
SCHEDULED = "c-growing"  # the incremental schedule's conversation; the traffic adds to it
SCHEDULE_EVERY_SECONDS = 3
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # claims since then: all of them
ERROR_LINE = '"level": "ERROR"'  # in the JSON lines every part logs
IN_FLIGHT = 6  # operations the traffic keeps unended at most
END_TIMEOUT_SECONDS = 240.0


@dataclass
class Submitted:
    """An export the traffic submitted: through which api, and whether a callback was asked for."""

    operation_id: str
    conversation_id: str
    via: str
    callback: bool


@dataclass
class Upgrade:
    """The previous release's system (``old``), this release's beside it once started (``new``), the traffic's
    record, and what a test reads the database and the bucket with.
    """

    old: LocalSystem
    new: LocalSystem
    pool: asyncpg.Pool
    s3: Any
    receiver: Receiver
    receiver_url: str
    apis: dict[str, aiohttp.ClientSession] = field(default_factory=dict)
    submitted: list[Submitted] = field(default_factory=list)
    # (operation id, lease owner) of every chunk seen RUNNING, sampled while the traffic runs
    chunk_holders: set[tuple[str, str]] = field(default_factory=set)
    # release version -> worker ids ("<host>:<pid>") of its workers
    workers: dict[str, set[str]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    schedule_id: str = ""
    since: datetime = EPOCH
    _retired: list[aiohttp.ClientSession] = field(default_factory=list)
    _round: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def auth(self) -> Callable[..., dict[str, str]]:
        """Headers with a token both releases accept (they share the secret)."""
        return headers_for(self.new)

    def open_api(self, name: str, system: LocalSystem) -> None:
        """Send traffic through the api process of ``system`` from now on, as ``name``."""
        self.apis[name] = aiohttp.ClientSession(base_url=system.base_url)

    async def retire_api(self, name: str) -> None:
        """Send no more traffic through ``name``, once the round under way has ended (before its process stops,
        as a load balancer drains it); its session is closed with the others at the end."""
        async with self._round:
            self._retired.append(self.apis.pop(name))

    async def close_apis(self) -> None:
        """Close the session of every api, retired or not."""
        for session in [*self.apis.values(), *self._retired]:
            await session.close()
        self.apis.clear()
        self._retired.clear()

    def note_workers(self, version: str, system: LocalSystem) -> None:
        """Remember the worker ids of ``system``'s running workers as ``version``'s."""
        host = socket.gethostname()  # the worker id's host part, as the parts read it
        ids = {f"{host}:{pid}" for name, pid in system.group.pids().items() if name.startswith("worker")}
        self.workers.setdefault(version, set()).update(ids)

    @contextlib.contextmanager
    def timed(self, step: str) -> Any:
        """Record how long the block took as ``step``."""
        started = time.monotonic()
        yield
        self.timings[step] = round(time.monotonic() - started, 1)

    async def seed(self) -> None:
        """Create the conversations and the schedule through the api that runs (the previous release's)."""
        api = next(iter(self.apis.values()))
        for cid, count in {**CONVERSATIONS, SCHEDULED: 10}.items():
            await make_conversation(api, self.auth, cid, [OWNER, "bob"])
            for start in range(0, count, 5_000):
                lines = [_message(cid, n) for n in range(start, min(count, start + 5_000))]
                await import_lines(api, self.auth, cid, lines)
        response = await api.post(
            f"/v3/conversations/{SCHEDULED}/export-schedules",
            json={"every": f"PT{SCHEDULE_EVERY_SECONDS}S", "mode": "incremental", "format": "jsonl"},
            headers={**self.auth(OWNER), "Idempotency-Key": "upgrade-schedule"},
        )
        assert response.status == 201, await response.text()
        self.schedule_id = (await response.json())["schedule_id"]

    async def traffic(self, stop: asyncio.Event) -> None:
        """Submit, poll, cancel and download through every open api until ``stop`` is set; raises
        ``AssertionError`` for an answer no release may give.
        """
        grown = 10
        for number in itertools.count(1):
            if stop.is_set():
                return
            if await self._unended() >= IN_FLIGHT:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)  # pacing the load, not waiting for a state
                continue
            async with self._round:  # an api is retired between rounds
                grown = await self._round_of_traffic(number, grown)

    async def _round_of_traffic(self, number: int, grown: int) -> int:
        """Submit one export through one api, poll it and perhaps cancel it through another, download a finished
        one through that other, and add a message to the scheduled conversation every fifth round; return how
        many messages that conversation has now.
        """
        names = sorted(self.apis)
        via, other = names[number % len(names)], names[(number + 1) % len(names)]
        cid = list(CONVERSATIONS)[number % len(CONVERSATIONS)]
        body: dict[str, Any] = {"format": "jsonl"}
        if number % 4 == 0:
            body["notify"] = {"url": self.receiver_url}
        response = await submit(self.apis[via], self.auth, OWNER, cid, body, f"upgrade-{number}")
        assert response.status == 202, (via, await response.text())
        operation_id = (await response.json())["operation_id"]
        self.submitted.append(Submitted(operation_id, cid, via, "notify" in body))
        polled = await self.apis[other].get(f"/v3/operations/{operation_id}", headers=self.auth(OWNER))
        assert polled.status == 200, (other, await polled.text())
        if number % 7 == 0:
            canceled = await self.apis[other].post(f"/v3/operations/{operation_id}/cancel", headers=self.auth(OWNER))
            assert canceled.status in (200, 202, 409), (other, await canceled.text())
        await self._download_one(other)
        if number % 5 == 0:
            await import_lines(self.apis[via], self.auth, SCHEDULED, [_message(SCHEDULED, grown)])
            grown += 1
        return grown

    async def sample_chunk_holders(self, stop: asyncio.Event) -> None:
        """Record which worker holds each RUNNING chunk, every 50 ms, until ``stop`` is set."""
        while not stop.is_set():
            rows = await self.pool.fetch(
                "SELECT operation_id, lease_owner FROM export_chunks"
                " WHERE state = 'RUNNING' AND lease_owner IS NOT NULL"
            )
            self.chunk_holders.update((row["operation_id"], row["lease_owner"]) for row in rows)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)

    def releases_holding_chunks_of_one_export(self) -> set[str]:
        """The most releases whose workers held chunks of one export, among the exports sampled."""
        by_export: dict[str, set[str]] = {}
        for operation_id, owner in self.chunk_holders:
            by_export.setdefault(operation_id, set()).update(self._release_of(owner))
        return max(by_export.values(), key=len, default=set())

    async def both_started(self) -> None:
        """Count claims from now on only: what ``releases_that_claimed`` and the chunk sampler report is what
        the releases did side by side."""
        self.since = await self.pool.fetchval("SELECT now()")
        self.chunk_holders.clear()

    async def releases_that_claimed(self) -> set[str]:
        """The releases whose workers claimed an attempt of an export since ``both_started``."""
        owners = await self.pool.fetch("SELECT DISTINCT worker_id FROM attempts WHERE claimed_at >= $1", self.since)
        return {release for row in owners for release in self._release_of(row["worker_id"])}

    async def coordinating(self, version: str) -> bool:
        """Whether a worker of ``version`` holds the lease of a RUNNING chunked export with at least two chunks
        not DONE: work that cannot end in the milliseconds before a stop sent next. (A small export's lease,
        seen held, can end before the signal lands, and then nothing is handed back.)
        """
        held: bool = await self.pool.fetchval(
            "SELECT EXISTS (SELECT 1 FROM attempts a JOIN operations o USING (operation_id)"
            " WHERE a.ended_at IS NULL AND a.worker_id = ANY($1::text[]) AND o.state = 'RUNNING'"
            " AND (SELECT count(*) FROM export_chunks c WHERE c.operation_id = a.operation_id"
            " AND c.state <> 'DONE') >= 2)",
            list(self.workers.get(version, ())),
        )
        return held

    async def fired_since_both_started(self) -> bool:
        """Whether the schedule has a run due at or after ``both_started``: one that the releases side by side,
        or the one left, created (``check_the_schedule`` asks for one)."""
        due = await self.pool.fetchval("SELECT max(due_at) FROM operations WHERE schedule_id = $1", self.schedule_id)
        return due is not None and due >= self.since

    def check_no_error_logged(self) -> None:
        """Fail when a part of either release logged an error: what one release wrote, the other could not
        handle."""
        for system in (self.old, self.new):
            for path in sorted(system.log_dir.glob("*.log")):
                errors = [line for line in path.read_text(errors="replace").splitlines() if ERROR_LINE in line]
                assert not errors, f"{path.parent.name}/{path.name}: {errors[0][:2000]}"

    async def check_nothing_dead_lettered(self) -> None:
        """Fail when a message went to the dead-letter queue: a part of one release could not read what the
        other wrote (docs/deploy.md: Upgrading, Payload versions)."""
        settings = self.new.settings()
        connection = await connect(settings, name="upgrade-test")
        try:
            channel = await connection.channel()
            queue = await channel.declare_queue(dead_queue_name(settings), passive=True)
            count = queue.declaration_result.message_count
        finally:
            await connection.close()
        assert count == 0, f"{count} messages dead-lettered: one release could not read what the other wrote"

    async def summary(self) -> dict[str, Any]:
        """What the traffic did, for the test's output: operations by state, attempts by release, chunks by
        release, callbacks received and schedule runs."""
        states = await self.pool.fetch("SELECT state, count(*) FROM operations GROUP BY state")
        attempts: dict[str, int] = {}
        for row in await self.pool.fetch("SELECT worker_id, count(*) FROM attempts GROUP BY worker_id"):
            for version in self._release_of(row["worker_id"]):
                attempts[version] = attempts.get(version, 0) + row["count"]
        chunks: dict[str, int] = {}
        for _, owner in self.chunk_holders:
            for version in self._release_of(owner):
                chunks[version] = chunks.get(version, 0) + 1
        runs = await self.pool.fetchval("SELECT count(*) FROM operations WHERE schedule_id IS NOT NULL")
        return {
            "operations": {row["state"]: row["count"] for row in states},
            "attempts by release": attempts,
            "chunk leases seen by release": chunks,
            "callbacks": len(self.receiver.received),
            "schedule runs": runs,
        }

    def unexpected_exits(self) -> dict[str, int]:
        """The parts of this release's system that ended without being stopped (one-shot commands aside)."""
        return {name: code for name, code in self.new.group.exited().items() if not name.startswith("cli-")}

    async def finished_by(self, version: str, *, handed_back_by: str) -> int:
        """How many exports a worker of ``handed_back_by`` handed back and a worker of ``version`` then finished."""
        count: int = await self.pool.fetchval(
            "SELECT count(DISTINCT b.operation_id) FROM attempts b JOIN attempts f USING (operation_id)"
            " WHERE b.outcome = 'HANDED_BACK' AND b.worker_id = ANY($1::text[])"
            " AND f.outcome = 'SUCCEEDED' AND f.worker_id = ANY($2::text[]) AND f.generation > b.generation",
            list(self.workers.get(handed_back_by, ())),
            list(self.workers.get(version, ())),
        )
        return count

    def _release_of(self, worker_id: str) -> set[str]:
        return {version for version, ids in self.workers.items() if worker_id in ids}

    async def _unended(self) -> int:
        count: int = await self.pool.fetchval(
            "SELECT count(*) FROM operations WHERE NOT state = ANY($1::text[])", values(TERMINAL)
        )
        return count

    async def _download_one(self, via: str) -> None:
        """Download the newest SUCCEEDED export not downloaded yet through ``via``; its bytes must verify."""
        row = await self.pool.fetchrow(
            "SELECT operation_id, result_sha256 FROM operations WHERE state = 'SUCCEEDED' AND schedule_id IS NULL"
            " ORDER BY updated_at DESC LIMIT 1"
        )
        if row is None:
            return
        response = await self.apis[via].get(f"/v3/exports/{row['operation_id']}/result", headers=self.auth(OWNER))
        if response.status == 410:  # expired meanwhile
            return
        assert response.status == 200, (via, await response.text())
        assert hashlib.sha256(await response.read()).hexdigest() == row["result_sha256"]

    async def check_every_export_ended_once(self, via: str) -> None:
        """Every operation is terminal; each SUCCEEDED one succeeded in exactly one attempt, and its file,
        downloaded through ``via``, is the conversation's as it is; each callback was sent for one event.
        """

        async def all_ended() -> bool:
            return await self._unended() == 0

        await wait_for(all_ended, timeout=END_TIMEOUT_SECONDS, interval=0.5)
        await self.check_nothing_dead_lettered()
        self.check_no_error_logged()
        rows = await self.pool.fetch(
            "SELECT o.operation_id, o.state, o.conversation_id, o.result_sha256, o.schedule_id,"
            " (SELECT count(*) FROM attempts a WHERE a.operation_id = o.operation_id AND a.outcome = 'SUCCEEDED')"
            " AS successes FROM operations o"
        )
        assert {row["state"] for row in rows} <= {"SUCCEEDED", "CANCELED"}, [dict(r) for r in rows]
        expected = {cid: expected_file(await read_all(self.apis[via], self.auth, OWNER, cid)) for cid in CONVERSATIONS}
        for row in rows:
            assert row["successes"] == (1 if row["state"] == "SUCCEEDED" else 0), dict(row)
            if row["state"] != "SUCCEEDED" or row["schedule_id"] is not None:
                continue
            response = await self.apis[via].get(f"/v3/exports/{row['operation_id']}/result", headers=self.auth(OWNER))
            assert response.status == 200, await response.text()
            content = await response.read()
            assert hashlib.sha256(content).hexdigest() == row["result_sha256"]
            assert content == expected[row["conversation_id"]], row["operation_id"]
        states = {row["operation_id"]: row["state"] for row in rows}
        await self._check_callbacks(states)

    async def _check_callbacks(self, states: dict[str, str]) -> None:
        """Each export that asked for a callback got one event, for its end (retries of it share its id)."""
        asked = [item.operation_id for item in self.submitted if item.callback]

        async def delivered() -> bool:
            return {message["data"]["operation_id"] for message in self._callbacks()} >= set(asked)

        await wait_for(delivered, timeout=60)
        events: dict[str, set[tuple[str, str]]] = {}
        for headers, body in self.receiver.received:
            message = json.loads(body)
            events.setdefault(message["data"]["operation_id"], set()).add((headers["webhook-id"], message["type"]))
        for operation_id in asked:
            assert len(events[operation_id]) == 1, events[operation_id]
            ((_, kind),) = events[operation_id]
            assert kind == f"export.{states[operation_id].lower()}", (operation_id, kind)

    def _callbacks(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.receiver.received]

    async def check_the_schedule(self, via: str) -> None:
        """The schedule's runs are one per due time, on its grid, all SUCCEEDED, and their files, in due order,
        hold each message of the conversation once, in order, with no gap: the chain held across releases.
        """
        schedule = await self.pool.fetchrow(
            "SELECT start_at, every FROM export_schedules WHERE schedule_id = $1", self.schedule_id
        )
        runs = await self.pool.fetch(
            "SELECT operation_id, state, due_at FROM operations WHERE schedule_id = $1 ORDER BY due_at",
            self.schedule_id,
        )
        assert len(runs) >= 2, "the schedule did not fire during the upgrade"
        assert runs[-1]["due_at"] >= self.since, "no run was due while both releases ran or after"
        assert all(run["state"] == "SUCCEEDED" for run in runs), [dict(run) for run in runs]
        step = timedelta(seconds=SCHEDULE_EVERY_SECONDS)
        for run in runs:
            offset: timedelta = run["due_at"] - schedule["start_at"]
            assert offset % step == timedelta(0), (run["due_at"], schedule["start_at"])
        exported: list[str] = []
        for run in runs:
            response = await self.apis[via].get(f"/v3/exports/{run['operation_id']}/result", headers=self.auth(OWNER))
            assert response.status == 200, await response.text()
            exported += [json.loads(line)["message_id"] for line in (await response.read()).splitlines()]
        stored = [message["message_id"] for message in await read_all(self.apis[via], self.auth, OWNER, SCHEDULED)]
        assert exported == stored[: len(exported)], "the runs' files repeat or skip a message"
        assert len(exported) >= 10

    async def check_no_unknown_object(self) -> None:
        """Every object left in the bucket is a SUCCEEDED export's file: the janitor removed the rest."""

        async def only_results() -> bool:
            return await self._objects() <= await self._result_keys()

        await wait_for(only_results, timeout=60, interval=0.5)

    async def _objects(self) -> set[str]:
        keys: set[str] = set()
        paginator = self.s3.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=self.new.settings().s3_bucket):
            keys.update(item["Key"] for item in page.get("Contents", []))
        return keys

    async def _result_keys(self) -> set[str]:
        rows = await self.pool.fetch("SELECT result_key FROM operations WHERE state = 'SUCCEEDED'")
        return {row["result_key"] for row in rows}


def _message(cid: str, number: int) -> dict[str, Any]:
    return {"message_id": f"{cid}-m{number}", "sender_id": OWNER if number % 2 else "bob", "body": "x" * 180}


@contextlib.asynccontextmanager
async def upgrade_under_way(release: Release, log_dir: Path) -> AsyncIterator[Upgrade]:
    """The previous ``release`` running (api, relay, two workers, a janitor) on a new database it migrated,
    seeded, with this release's system prepared beside it but not started; everything stopped, and the
    database and broker objects removed, at the end.
    """
    name = f"chatexport_up_{uuid.uuid4().hex[:10]}"
    database_url = f"{PG_SERVER}/{name}"
    moto: MotoServer = start_moto()
    old = LocalSystem(
        database_url=database_url, amqp_url=AMQP_URL, log_dir=log_dir / "old", overrides=SETTINGS, release=release
    )
    new = LocalSystem(database_url=database_url, amqp_url=AMQP_URL, log_dir=log_dir / "new", beside=old)
    try:
        old.start_storage(moto)
        new.start_storage(moto)
        old.start_parts(workers=2, janitors=1)
        receiver = Receiver()
        async with (
            asyncpg.create_pool(database_url, min_size=1, max_size=4) as pool,
            open_s3_client(new.settings()) as s3,
            listening(receiver) as port,
        ):
            upgrade = Upgrade(
                old=old, new=new, pool=pool, s3=s3, receiver=receiver, receiver_url=f"http://127.0.0.1:{port}/hook"
            )
            upgrade.open_api("old", old)
            upgrade.note_workers(release.version, old)
            try:
                await upgrade.seed()
                yield upgrade
            finally:
                await upgrade.close_apis()
    finally:
        # Each is stopped even when one before it fails to stop: no process or database is left behind.
        for stop in (new.stop, old.stop, moto.stop):
            try:
                stop()
            except Exception:
                log.exception("could not stop part of the upgrade's systems")
        with contextlib.suppress(Exception):
            await delete_broker_objects(new.settings())
        await admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
