"""``chatexport schedules`` (docs/schedule-exports.md: Fetching the files), run as the ``chatexport`` command in its
own process against the real API, with the relay, worker and janitor (which fires the schedules) running: the
actions and their refusals, and ``fetch``, which resumes a download of a fetch that was killed in the middle of
it, verifies each file, names it by due time and operation id (parts and ``.gz`` included), skips what the
folder holds and reports a run whose result expired before it was fetched.

Time passes by moving a schedule, its runs and their due times an hour back (``an_hour_passes``): the next due
time of an hourly schedule comes at once, and no other comes on its own while a test runs.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web

from chatexport.client import schedule_commands
from devtools.broker import delete_broker_objects
from devtools.moto import MotoServer
from shared.settings import Settings
from tests.support import make_settings, wait_for
from tests.support.api_calls import Headers, expected_file, import_lines, make_conversation, read_all
from tests.support.messages import Client
from tests.support.rows import shift
from tests.support.storage_proxy import StorageProxy

pytestmark = pytest.mark.module_database

CID = "c-schedules"
EVERY = "PT1H"
# The first run's file, of some 300 kB, and how much of it comes before its download hangs.
FIRST_MESSAGES = 2000
HELD_BYTES = 100_000


@pytest.fixture
async def settings(database_url: str, moto: MotoServer) -> AsyncIterator[Settings]:
    """This test's settings with a scheduler that fires within a fraction of a second."""
    test_settings = make_settings(database_url, moto.endpoint_url, scheduler_interval_seconds=0.1)
    yield test_settings
    await delete_broker_objects(test_settings)


@dataclass(frozen=True)
class Run:
    """One run of the command: its exit code and what it printed."""

    code: int
    stdout: str
    stderr: str


async def start(api_url: str, token: str, *args: str) -> asyncio.subprocess.Process:
    """Start ``chatexport ARGS`` against the API at ``api_url`` with ``token``, its output piped."""
    env = {**os.environ, "CHATEXPORT_API_URL": api_url, "CHATEXPORT_TOKEN": token}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "chatexport.cli",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def chatexport(api_url: str, token: str, *args: str) -> Run:
    """Run ``chatexport ARGS`` against the API at ``api_url`` with ``token``; fail after 60 s."""
    process = await start(api_url, token, *args)
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return Run(process.returncode, stdout.decode(), stderr.decode())


class Proxy(StorageProxy):
    """A ``StorageProxy`` in front of the API: while ``hold_after`` is set, the body of a file download stops
    after that many bytes, its answer hanging until ``release`` is set, when the connection drops.
    """

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.hold_after: int | None = None
        self.release = asyncio.Event()

    async def _respond(
        self, request: web.Request, status: int, body: bytes, headers: dict[str, str]
    ) -> web.StreamResponse:
        if self.hold_after is None or "/result" not in request.path or len(body) <= self.hold_after:
            return await super()._respond(request, status, body, headers)
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body[: self.hold_after])
        await self.release.wait()
        assert request.transport is not None
        request.transport.close()
        return response


@pytest.fixture
async def proxy(api: Client) -> AsyncIterator[Proxy]:
    """A proxy in front of the test's API."""
    running = Proxy(str(api.make_url("")))
    await running.start()
    yield running
    running.release.set()
    await running.close()


def api_url(api: Client) -> str:
    return str(api.make_url("")).rstrip("/")


def token_of(auth: Headers, user: str) -> str:
    return auth(user)["Authorization"].removeprefix("Bearer ")


async def add_messages(api: Client, auth: Headers, prefix: str, count: int) -> None:
    lines = [{"message_id": f"{prefix}{n}", "sender_id": "alice", "body": f"{prefix} body {n}"} for n in range(count)]
    await import_lines(api, auth, CID, lines)


async def create(api: Client, auth: Headers, *options: str) -> str:
    """Alice's hourly schedule of ``c-schedules`` created with the command and ``options``; its id. Its first
    run is due at once.
    """
    created = await chatexport(
        api_url(api), token_of(auth, "alice"), "schedules", "create", CID, "--every", EVERY, *options
    )
    assert created.code == 0, created
    schedule_id = created.stdout.split()[0]
    assert schedule_id.startswith("sch_") and " ACTIVE " in created.stdout, created
    return schedule_id


async def runs(api: Client, auth: Headers, schedule_id: str) -> list[dict[str, Any]]:
    """The schedule's runs as the API shows them, oldest first."""
    response = await api.get(f"/v3/export-schedules/{schedule_id}/runs", params={"limit": "100"}, headers=auth("alice"))
    assert response.status == 200, await response.text()
    page = await response.json()
    assert page["next_cursor"] is None
    return list(reversed(page["operations"]))


async def ended_runs(api: Client, auth: Headers, schedule_id: str, count: int) -> list[dict[str, Any]]:
    """The schedule's runs once there are ``count`` and each has ended; each must have SUCCEEDED."""

    async def ended() -> list[dict[str, Any]] | None:
        found = await runs(api, auth, schedule_id)
        return found if len(found) == count and all(run["done"] for run in found) else None

    found: list[dict[str, Any]] = await wait_for(ended, timeout=30)
    assert [run["state"] for run in found] == ["SUCCEEDED"] * count, found
    return found


async def an_hour_passes(pool: asyncpg.Pool, schedule_id: str) -> None:
    """Move the schedule, its runs and their due times an hour back: its next due time is now."""
    await pool.execute(
        "UPDATE export_schedules SET start_at = start_at - interval '1 hour',"
        " next_run_at = next_run_at - interval '1 hour' WHERE schedule_id = $1",
        schedule_id,
    )
    await pool.execute("UPDATE operations SET due_at = due_at - interval '1 hour' WHERE schedule_id = $1", schedule_id)


def file_name(run: dict[str, Any], suffix: str) -> str:
    """The name ``fetch`` gives a run's file: its due time and operation id, then ``suffix``."""
    due = datetime.fromisoformat(run["due_at"]).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{due}-{run['operation_id']}{suffix}"


async def test_fetch_resumes_verifies_and_reports_an_expired_run(
    api: Client, auth: Headers, pool: asyncpg.Pool, pipeline: None, proxy: Proxy, tmp_path: Path
) -> None:
    await make_conversation(api, auth, CID, ["alice"])
    await add_messages(api, auth, "first", FIRST_MESSAGES)
    schedule_id = await create(api, auth)
    await ended_runs(api, auth, schedule_id, 1)
    # Three runs of a chain: every message, then 20 new ones, then 10 more.
    for number, (prefix, count) in enumerate((("second", 20), ("third", 10)), start=2):
        await add_messages(api, auth, prefix, count)
        await an_hour_passes(pool, schedule_id)
        await ended_runs(api, auth, schedule_id, number)
    paused = await chatexport(api_url(api), token_of(auth, "alice"), "schedules", "pause", schedule_id)
    assert paused.code == 0 and "PAUSED (USER)" in paused.stdout, paused
    messages = await read_all(api, auth, "alice", CID)
    first, second, third = await runs(api, auth, schedule_id)
    # The second run's result expires before anyone fetched it: the janitor deletes its file.
    await shift(pool, second["operation_id"], "result_expires_at", "-1 second")
    await wait_for(lambda: runs_in_state(api, auth, schedule_id, "EXPIRED"), timeout=30)
    folder = tmp_path / "fetched"
    alice = token_of(auth, "alice")

    # The oldest run first: the fetch is killed once some of its file is on disk, the rest still to come.
    first_file = folder / file_name(first, ".jsonl")
    part = folder / (first_file.name + ".part")
    proxy.hold_after = HELD_BYTES
    killed = await start(proxy.url, alice, "schedules", "fetch", schedule_id, "-o", str(folder))
    await wait_for(lambda: part.exists() and part.stat().st_size > 0)
    killed.kill()
    await killed.communicate()
    proxy.release.set()
    have = part.stat().st_size
    assert have <= HELD_BYTES and part.read_bytes() == expected_file(messages[:FIRST_MESSAGES])[:have]
    assert sorted(path.name for path in folder.iterdir()) == [part.name]

    proxy.hold_after = None
    proxy.requests.clear()
    resumed = await chatexport(proxy.url, alice, "schedules", "fetch", schedule_id, "-o", str(folder))

    assert resumed.code == 1, resumed
    downloads = [seen.headers for seen in proxy.requests if seen.path == f"/v3/exports/{first['operation_id']}/result"]
    assert [headers.get("Range") for headers in downloads] == [f"bytes={have}-"]
    assert second["operation_id"] in resumed.stderr and "expired before it was fetched" in resumed.stderr
    assert f"after seq {FIRST_MESSAGES} up to seq {FIRST_MESSAGES + 20}" in resumed.stderr
    third_file = folder / file_name(third, ".jsonl")
    assert sorted(path.name for path in folder.iterdir()) == sorted([first_file.name, third_file.name])
    # Each file is the run's, as its status gives it, and the files hold the chain but the expired run.
    for run, path in ((first, first_file), (third, third_file)):
        content = path.read_bytes()
        assert (len(content), hashlib.sha256(content).hexdigest()) == (
            run["result"]["size_bytes"],
            run["result"]["sha256"],
        )
        assert f"{path}: {run['result']['message_count']} messages" in resumed.stdout
    assert first_file.read_bytes() + third_file.read_bytes() == expected_file(
        messages[:FIRST_MESSAGES] + messages[FIRST_MESSAGES + 20 :]
    )
    assert f"{schedule_id}: runs fetched 2, already in {folder} 0, expired before they were fetched 1" in resumed.stdout

    # What the folder holds is not fetched again; the expired run is reported at every fetch.
    proxy.requests.clear()
    again = await chatexport(proxy.url, alice, "schedules", "fetch", schedule_id, "-o", str(folder))
    assert again.code == 1, again
    assert f"runs fetched 0, already in {folder} 2, expired before they were fetched 1" in again.stdout
    assert not [seen for seen in proxy.requests if "/result" in seen.path]


async def test_a_run_whose_file_is_lost_is_reported_and_the_later_runs_are_fetched(
    api: Client, auth: Headers, pool: asyncpg.Pool, pipeline: None, s3: Any, settings: Settings, tmp_path: Path
) -> None:
    await make_conversation(api, auth, CID, ["alice"])
    await add_messages(api, auth, "first", 3)
    schedule_id = await create(api, auth)
    await ended_runs(api, auth, schedule_id, 1)
    await add_messages(api, auth, "second", 2)
    await an_hour_passes(pool, schedule_id)
    first, second = await ended_runs(api, auth, schedule_id, 2)
    # The first run's file is gone from storage behind the service's back: its download is a 500.
    key = await pool.fetchval("SELECT result_key FROM operations WHERE operation_id = $1", first["operation_id"])
    await s3.delete_object(Bucket=settings.s3_bucket, Key=key)
    folder = tmp_path / "fetched"

    fetched = await chatexport(
        api_url(api), token_of(auth, "alice"), "schedules", "fetch", schedule_id, "-o", str(folder)
    )

    assert fetched.code == 3, fetched
    assert f"{first['operation_id']} (due {first['due_at']}) could not be fetched: INTERNAL" in fetched.stderr
    assert [path.name for path in folder.iterdir()] == [file_name(second, ".jsonl")]
    assert f"runs fetched 1, already in {folder} 0, expired before they were fetched 0, refused 1" in fetched.stdout


async def runs_in_state(api: Client, auth: Headers, schedule_id: str, state: str) -> bool:
    return any(run["state"] == state for run in await runs(api, auth, schedule_id))


async def test_fetch_names_parts_of_a_split_gzip_result(
    api: Client, auth: Headers, pipeline: None, tmp_path: Path
) -> None:
    await make_conversation(api, auth, CID, ["alice"])
    await add_messages(api, auth, "m", 40)
    schedule_id = await create(api, auth, "--gzip", "--max-part-bytes", "5242880")
    [run] = await ended_runs(api, auth, schedule_id, 1)

    fetched = await chatexport(
        api_url(api), token_of(auth, "alice"), "schedules", "fetch", schedule_id, "-o", str(tmp_path / "out")
    )

    assert fetched.code == 0, fetched
    # 40 short messages fit in one part; the names are the same for more.
    part = tmp_path / "out" / file_name(run, "-part-1.jsonl.gz")
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [part.name]
    assert gzip.decompress(part.read_bytes()) == expected_file(await read_all(api, auth, "alice", CID))
    assert f"{schedule_id}: runs fetched 1, already in" in fetched.stdout


async def test_create_list_show_pause_resume_delete_and_their_refusals(
    api: Client, auth: Headers, tmp_path: Path
) -> None:
    await make_conversation(api, auth, CID, ["alice"])
    alice, url = token_of(auth, "alice"), api_url(api)
    command = ("schedules", "create", CID, "--every", "P1D", "--start-at", "2100-01-31T00:00:00+01:00")

    created = await chatexport(
        url, alice, *command, "--idempotency-key", "k-cli", "--sender", "alice", "--mode", "full"
    )
    replayed = await chatexport(
        url, alice, *command, "--idempotency-key", "k-cli", "--sender", "alice", "--mode", "full"
    )

    assert (created.code, replayed.code) == (0, 0), (created, replayed)
    schedule_id = created.stdout.split()[0]
    assert replayed.stdout.split()[0] == schedule_id and "(replayed)" in replayed.stdout
    assert "every P1D  full  next run at 2100-01-30T23:00:00.000Z" in created.stdout
    listed = await chatexport(url, alice, "schedules", "list")
    assert listed.code == 0 and listed.stdout.splitlines() == [created.stdout.strip()], listed
    shown = await chatexport(url, alice, "schedules", "show", schedule_id)
    assert shown.code == 0, shown
    assert '"senders": [\n      "alice"\n    ]' in shown.stdout and '"mode": "full"' in shown.stdout

    paused = await chatexport(url, alice, "schedules", "pause", schedule_id)
    assert paused.code == 0 and "PAUSED (USER)" in paused.stdout and "next run at none" in paused.stdout, paused
    resumed = await chatexport(url, alice, "schedules", "resume", schedule_id)
    assert resumed.code == 0 and " ACTIVE " in resumed.stdout and "next run at 2100-01-30T23:00" in resumed.stdout

    hidden = await chatexport(url, token_of(auth, "mallory"), "schedules", "show", schedule_id)
    assert hidden.code == 3 and "NOT_FOUND" in hidden.stderr, hidden
    too_short = await chatexport(url, alice, "schedules", "create", CID, "--every", "PT1M")
    assert too_short.code == 3 and "SCHEDULE_INTERVAL_TOO_SHORT" in too_short.stderr, too_short
    not_a_duration = await chatexport(url, alice, "schedules", "create", CID, "--every", "daily")
    assert not_a_duration.code == 3 and "SCHEDULE_INTERVAL_INVALID" in not_a_duration.stderr, not_a_duration

    deleted = await chatexport(url, alice, "schedules", "delete", schedule_id)
    assert deleted.code == 0 and f"{schedule_id}: deleted" in deleted.stdout, deleted
    gone = await chatexport(url, alice, "schedules", "fetch", schedule_id, "-o", str(tmp_path / "out"))
    assert gone.code == 3 and "NOT_FOUND" in gone.stderr, gone


@pytest.mark.parametrize(
    "arguments",
    [
        ("schedules", "show", "../x"),
        ("schedules", "create", CID, "--every", "P1D", "--until", "2024-01-01T00:00:00Z"),
        ("schedules", "create", CID, "--every", "P1D", "--before-seq", "9"),
        ("schedules", "create", CID, "--every", "P1D", "--start-at", "tomorrow"),
        ("schedules", "create", CID, "--every", "P1D", "--mode", "sometimes"),
        ("schedules", "create", CID),
        ("schedules", "fetch", "sch_1"),
        ("schedules", "fetch", "sch_1", "-o", "no-such-folder/out"),
    ],
)
async def test_bad_arguments_are_usage_errors(arguments: tuple[str, ...]) -> None:
    run = await chatexport("http://127.0.0.1:9", "token", *arguments)
    assert run.code == 2, run
    assert "Traceback" not in run.stderr


async def test_fetch_into_a_file_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    run = await chatexport("http://127.0.0.1:9", "token", "schedules", "fetch", "sch_1", "-o", str(tmp_path / "file"))
    assert run.code == 2, run


def test_the_create_options_reach_the_body_in_canonical_form() -> None:
    parser = argparse.ArgumentParser(prog="chatexport")
    schedule_commands.add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        [
            "schedules",
            "create",
            CID,
            "--every",
            "P1M",
            "--start-at",
            "2024-01-31T09:00:00.0001+01:00",
            "--mode",
            "full",
            "--sender",
            "bob",
            "--sender",
            "alice",
            "--gzip",
            "--notify-url",
            "https://example.com/hook",
        ]
    )
    assert schedule_commands.schedule_request(args) == {
        "every": "P1M",
        "format": "jsonl",
        # The next whole millisecond in UTC, as the export options' times.
        "start_at": "2024-01-31T08:00:00.001Z",
        "mode": "full",
        "senders": ["alice", "bob"],
        "compression": "gzip",
        "notify": {"url": "https://example.com/hook"},
    }
