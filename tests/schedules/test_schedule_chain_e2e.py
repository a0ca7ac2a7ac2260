"""Scheduled exports on the real processes (docs/schedules.md: Scheduled exports): an incremental chain over many
runs, with messages sent and recalled between them, whose files together hold every selected message exactly
once, in order; and a due time that comes while a run is unfinished, coalesced into one later run.

The system is one of this module's own: the test-only minimum interval of a second needs the development
environment, and the scheduler looks for due schedules five times a second.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import aiohttp
import asyncpg
import pytest

from devtools.localsystem import LocalSystem
from shared.states import TERMINAL
from tests.support import cloned_database, unique, wait_for
from tests.support.api_calls import Headers, import_lines, make_conversation
from tests.support.chains import RUNS_SQL, chain_findings
from tests.support.e2e import headers_for, local_system

pytestmark = pytest.mark.e2e

EVERY = "PT1S"
INTERVAL = timedelta(seconds=1)
SCHEDULE_SETTINGS = {
    "CHATEXPORT_ENVIRONMENT": "development",
    "CHATEXPORT_SCHEDULE_MIN_INTERVAL_SECONDS": "1",
    "CHATEXPORT_SCHEDULER_INTERVAL_SECONDS": "0.2",
    "CHATEXPORT_LEASE_SECONDS": "10",
    "CHATEXPORT_HEARTBEAT_SECONDS": "2",
}
# Rounds of messages sent and recalled, each followed by at least one more run that ended.
ROUNDS = 8
# Due times that pass while the first run cannot end, to be coalesced into one run.
MISSED = 4
RUN_TIMEOUT_SECONDS = 60.0


@pytest.fixture(scope="module")
async def schedule_system(template_db: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalSystem]:
    """The compose file's parts on a database of their own, with schedules every second allowed."""
    async with (
        cloned_database(template_db, "chatexport_schedules") as database,
        local_system(database, tmp_path_factory.mktemp("e2e-schedule-logs"), **SCHEDULE_SETTINGS) as local,
    ):
        yield local


@pytest.fixture
async def api(schedule_system: LocalSystem) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=schedule_system.base_url) as session:
        yield session


@pytest.fixture
def auth(schedule_system: LocalSystem) -> Headers:
    return headers_for(schedule_system)


@pytest.fixture
async def database(schedule_system: LocalSystem) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(schedule_system.env["CHATEXPORT_DATABASE_URL"])
    yield connection
    await connection.close()


async def create_schedule(api: Any, auth: Headers, user: str, cid: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await api.post(
        f"/v3/conversations/{cid}/export-schedules",
        json=body,
        headers={**auth(user), "Idempotency-Key": unique("key")},
    )
    assert response.status == 201, await response.text()
    schedule: dict[str, Any] = await response.json()
    assert response.headers["Location"] == schedule["links"]["self"]
    return schedule


async def runs_of(api: Any, auth: Headers, user: str, schedule: dict[str, Any]) -> list[dict[str, Any]]:
    """Every run of ``schedule``, oldest due time first, read page by page."""
    found: list[dict[str, Any]] = []
    params = {"limit": "4"}
    while True:
        response = await api.get(schedule["links"]["runs"], params=params, headers=auth(user))
        assert response.status == 200, await response.text()
        page = await response.json()
        found += page["operations"]
        if page["next_cursor"] is None:
            return found[::-1]
        params["cursor"] = page["next_cursor"]


async def all_ended(api: Any, auth: Headers, user: str, schedule: dict[str, Any]) -> list[dict[str, Any]] | None:
    runs = await runs_of(api, auth, user, schedule)
    return runs if all(run["state"] in TERMINAL for run in runs) else None


async def send(api: Any, auth: Headers, user: str, cid: str, message_id: str) -> None:
    response = await api.post(
        f"/v2/conversations/{cid}/messages",
        json={"message_id": message_id, "body": message_id[:6]},
        headers=auth(user),
    )
    assert response.status == 200, await response.text()


async def recall(api: Any, auth: Headers, user: str, cid: str, message_id: str) -> None:
    response = await api.delete(f"/v2/conversations/{cid}/messages/{message_id}", headers=auth(user))
    assert response.status == 200, await response.text()


async def downloaded(api: Any, auth: Headers, user: str, run: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages of a SUCCEEDED run's file, once its bytes match the result's sha256."""
    response = await api.get(run["result"]["url"], headers=auth(user))
    assert response.status == 200, await response.text()
    content = await response.read()
    assert hashlib.sha256(content).hexdigest() == run["result"]["sha256"]
    return [json.loads(line) for line in content.splitlines()]


async def test_a_chain_of_many_runs_holds_every_selected_message_once_in_order(
    api: Any, auth: Headers, database: asyncpg.Connection
) -> None:
    cid = unique("chain")
    await make_conversation(api, auth, cid, ["alice", "bob"])
    senders = itertools.cycle(["alice", "bob"])
    await import_lines(
        api, auth, cid, [{"message_id": f"old{n}", "sender_id": next(senders), "body": f"old {n}"} for n in range(6)]
    )
    schedule = await create_schedule(api, auth, "alice", cid, {"every": EVERY, "senders": ["alice"]})
    assert (schedule["state"], schedule["mode"], schedule["watermark"]) == ("ACTIVE", "incremental", 0)

    for number in range(ROUNDS):
        ended = len([run for run in await runs_of(api, auth, "alice", schedule) if run["state"] in TERMINAL])
        sent = ((f"r{number}a", "alice"), (f"r{number}b", "bob"), (f"r{number}c", "alice"), (f"r{number}d", "alice"))
        for message_id, sender in sent:
            await send(api, auth, sender, cid, message_id)
        # Recalled at once: most likely before a run reads it, then in no file.
        await recall(api, auth, "alice", cid, f"r{number}c")
        if number == ROUNDS // 2:
            # Long exported by the first run, whose file keeps it.
            await recall(api, auth, "alice", cid, "old0")

        async def another_run_ended(ended: int = ended) -> bool:
            runs = await runs_of(api, auth, "alice", schedule)
            return len([run for run in runs if run["state"] in TERMINAL]) > ended

        await wait_for(another_run_ended, timeout=RUN_TIMEOUT_SECONDS)

    paused = await api.post(f"{schedule['links']['self']}/pause", headers=auth("alice"))
    assert paused.status == 200 and (await paused.json())["state"] == "PAUSED"
    runs = await wait_for(lambda: all_ended(api, auth, "alice", schedule), timeout=RUN_TIMEOUT_SECONDS)
    assert [run["state"] for run in runs] == ["SUCCEEDED"] * len(runs) and len(runs) >= ROUNDS
    assert all(run["schedule_id"] == schedule["schedule_id"] for run in runs)
    files = {run["operation_id"]: await downloaded(api, auth, "alice", run) for run in runs}
    now = await (await api.get(schedule["links"]["self"], headers=auth("alice"))).json()

    seqs = {operation_id: [message["seq"] for message in file] for operation_id, file in files.items()}
    assert (
        await chain_findings(database, schedule["schedule_id"], start=0, watermark=now["watermark"], files=seqs) == []
    )
    # What the findings judged, seen from the API: each run starts where the one before read up to, and the
    # watermark is where the last one did.
    starts = [run["request"]["after_seq"] for run in runs]
    snapshots = [run["snapshot"]["max_seq"] for run in runs]
    assert starts == [0, *snapshots[:-1]] and now["watermark"] == snapshots[-1]
    exported = [message for file in files.values() for message in file]
    assert {message["sender_id"] for message in exported} == {"alice"}
    assert "old0" in {message["message_id"] for message in exported}, "recalled after its run ended"
    recalled = {f"r{number}c" for number in range(ROUNDS)}
    assert recalled - {message["message_id"] for message in exported}, "no recall came before its run read it"


@contextmanager
def workers_stopped(system: LocalSystem) -> Iterator[None]:
    """Every worker frozen (SIGSTOP) for the block: a run created meanwhile stays QUEUED."""
    workers = [name for name in system.group.pids() if name.startswith("worker")]
    for name in workers:
        system.group.send(name, signal.SIGSTOP)
    try:
        yield
    finally:
        for name in workers:
            system.group.send(name, signal.SIGCONT)


async def test_due_times_during_an_unfinished_run_are_coalesced_into_one_run(
    schedule_system: LocalSystem, api: Any, auth: Headers, database: asyncpg.Connection
) -> None:
    cid = unique("coalesce")
    await make_conversation(api, auth, cid, ["alice"])
    await import_lines(api, auth, cid, [{"message_id": "m1", "sender_id": "alice", "body": "x"}])

    async def runs(schedule_id: str) -> list[asyncpg.Record]:
        return await database.fetch(RUNS_SQL, schedule_id)

    with workers_stopped(schedule_system):
        schedule = await create_schedule(api, auth, "alice", cid, {"every": EVERY})
        schedule_id = schedule["schedule_id"]
        [first] = await wait_for(lambda: runs(schedule_id), timeout=RUN_TIMEOUT_SECONDS)

        async def missed() -> bool:
            return await database.fetchval("SELECT now()") >= first["due_at"] + MISSED * INTERVAL

        await wait_for(missed, timeout=RUN_TIMEOUT_SECONDS)
        assert [run["operation_id"] for run in await runs(schedule_id)] == [first["operation_id"]], "a second run"

    async def three_more() -> bool:
        return len(await runs(schedule_id)) >= 4

    await wait_for(three_more, timeout=RUN_TIMEOUT_SECONDS)
    paused = await api.post(f"{schedule['links']['self']}/pause", headers=auth("alice"))
    assert paused.status == 200

    async def ended() -> list[asyncpg.Record] | None:
        found = await runs(schedule_id)
        return found if all(run["state"] in TERMINAL for run in found) else None

    later = await wait_for(ended, timeout=RUN_TIMEOUT_SECONDS)
    assert later[0]["operation_id"] == first["operation_id"]
    second = later[1]
    # One run for the due times missed meanwhile, keyed by the latest of them: no burst, then or after.
    assert second["due_at"] >= first["due_at"] + MISSED * INTERVAL
    for earlier, run in itertools.pairwise(later):
        assert run["due_at"] <= run["created_at"] < run["due_at"] + INTERVAL, dict(run)
        assert earlier["finished_at"] <= run["created_at"], (dict(earlier), dict(run))
    assert [run["state"] for run in later] == ["SUCCEEDED"] * len(later)
