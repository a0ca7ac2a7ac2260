"""Waiting for a change without polling (docs/api.md: Operations, Waiting for a change): the long poll of
``GET /v3/operations/{id}?wait=N`` and the event stream of ``GET /v3/operations/{id}/events``, woken by the
LISTEN of the API process and by nothing else; their caps, their release when the client goes, and shutdown.
Changes are made with plain UPDATEs: the trigger of migration 0005 announces them as any transition would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest
from multidict import CIMultiDict

from devtools.moto import MotoServer
from services.api.exporting.changes import CHANGES
from services.api.http.keys import WAIT_SLOTS
from shared.repository import status_monitor
from shared.settings import Settings
from tests.support import wait_for
from tests.support.api_calls import expect_problem
from tests.support.messages import Auth, Client, configured_api, listen_now
from tests.support.rows import insert_operation

pytestmark = pytest.mark.module_database

OPERATION = "op_waiting"
URL = f"/v3/operations/{OPERATION}"


@pytest.fixture
async def api(settings: Settings, moto: MotoServer) -> AsyncIterator[Client]:
    """The API with two waiting requests per user and a heartbeat every 0.3 s, listening for changes."""
    async with configured_api(settings, moto, wait_per_user_concurrency=2, event_heartbeat_seconds=0.3) as client:
        await listen_now(client.app[CHANGES])
        yield client


def waiters(api: Client) -> int:
    return int(api.app[CHANGES].waiters)


async def set_state(pool: asyncpg.Pool, state: str) -> None:
    await pool.execute("UPDATE operations SET state = $2, updated_at = now() WHERE operation_id = $1", OPERATION, state)


async def set_progress(pool: asyncpg.Pool, messages_written: int) -> None:
    await pool.execute(
        "UPDATE operations SET messages_written = $2, updated_at = now() WHERE operation_id = $1",
        OPERATION,
        messages_written,
    )


async def test_a_long_poll_answers_as_soon_as_the_state_changes(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    await insert_operation(pool, OPERATION, "QUEUED")
    poll = asyncio.create_task(api.get(f"{URL}?wait=60", headers=auth("alice")))
    await wait_for(lambda: waiters(api) == 1)

    await set_state(pool, "RUNNING")

    response = await asyncio.wait_for(poll, 20)
    assert response.status == 200
    assert (await response.json())["state"] == "RUNNING"
    assert response.headers["Cache-Control"] == "no-store"
    await wait_for(lambda: waiters(api) == 0)


async def test_progress_alone_does_not_end_a_long_poll(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    await insert_operation(pool, OPERATION, "RUNNING")
    loop = asyncio.get_running_loop()
    started = loop.time()
    poll = asyncio.create_task(api.get(f"{URL}?wait=2", headers=auth("alice")))
    await wait_for(lambda: waiters(api) == 1)

    await set_progress(pool, 5)

    response = await asyncio.wait_for(poll, 20)
    body = await response.json()
    # Answered at the deadline, with the progress read then: a wake-up by the progress would come at once.
    assert loop.time() - started >= 2.0
    assert (body["state"], body["progress"]["messages_written"]) == ("RUNNING", 5)


async def test_a_terminal_operation_is_answered_at_once(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    await insert_operation(pool, OPERATION, "CANCELED")
    response = await asyncio.wait_for(api.get(f"{URL}?wait=60", headers=auth("alice")), 20)
    assert response.status == 200
    assert (await response.json())["state"] == "CANCELED"
    assert waiters(api) == 0


@pytest.mark.parametrize("query", ["wait=0", "wait=61", "wait=abc", "wait=1.5", "wait=%2B5", "wait=1&wait=2", "x=1"])
async def test_a_bad_wait_is_422(api: Client, auth: Auth, pool: asyncpg.Pool, query: str) -> None:
    await insert_operation(pool, OPERATION, "QUEUED")
    problem = await expect_problem(await api.get(f"{URL}?{query}", headers=auth("alice")), 422, "VALIDATION_FAILED")
    assert problem["errors"][0]["loc"][0] == "query"


async def test_waiting_has_the_status_monitors_authorization(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    await insert_operation(pool, OPERATION, "QUEUED")
    for path in (
        f"{URL}?wait=30",
        f"{URL}/events",
        "/v3/operations/op_nobody?wait=30",
        "/v3/operations/op_nobody/events",
    ):
        response = await asyncio.wait_for(api.get(path, headers=auth("mallory")), 20)
        await expect_problem(response, 404, "NOT_FOUND")
    assert waiters(api) == 0
    unauthenticated = await api.get(f"{URL}/events")
    await expect_problem(unauthenticated, 401, "UNAUTHENTICATED")


async def test_waiting_requests_are_capped_per_user_and_released_when_the_client_goes(
    api: Client, auth: Auth, pool: asyncpg.Pool
) -> None:
    await insert_operation(pool, OPERATION, "QUEUED")
    await insert_operation(pool, "op_bob", "QUEUED", owner_id="bob")
    base = str(api.make_url(""))
    async with aiohttp.ClientSession(base_url=base) as first, aiohttp.ClientSession(base_url=base) as second:
        held = [
            asyncio.create_task(first.get(f"{URL}?wait=60", headers=auth("alice"))),
            asyncio.create_task(second.get(f"{URL}/events", headers=auth("alice"))),
        ]
        await wait_for(lambda: api.app[WAIT_SLOTS].in_use == 2)
        refused = await api.get(f"{URL}?wait=60", headers=auth("alice"))
        problem = await expect_problem(refused, 429, "TOO_MANY_WAITERS")
        assert refused.headers["Retry-After"] == "5"
        assert problem["status"] == 429
        # Another user is not affected.
        other = await api.get("/v3/operations/op_bob?wait=1", headers=auth("bob"))
        assert other.status == 200
        for task in held:
            task.cancel()
    # Both clients went away without an answer: their slots come back without any change of the operation.
    await wait_for(lambda: api.app[WAIT_SLOTS].in_use == 0, timeout=10)
    assert waiters(api) == 0


async def read_event(response: aiohttp.ClientResponse) -> dict[str, str]:
    """The next event or comment of a stream as its fields (a comment as ``{"comment": ...}``); ``{}`` at
    the end of the stream.
    """
    fields: dict[str, str] = {}
    while True:
        line = (await asyncio.wait_for(response.content.readline(), 20)).decode()
        if line in ("\n", ""):
            return fields
        name, _, value = line.rstrip("\n").partition(":")
        fields[name or "comment"] = value.removeprefix(" ")


async def next_operation(response: aiohttp.ClientResponse) -> tuple[int, dict[str, Any]]:
    """The next ``operation`` event, skipping heartbeats: (id, representation)."""
    while True:
        event = await read_event(response)
        assert event, "the stream ended"
        if "comment" not in event:
            assert event["event"] == "operation"
            return int(event["id"]), json.loads(event["data"])


async def test_the_event_stream_sends_every_change_and_ends_after_a_terminal_state(
    api: Client, auth: Auth, pool: asyncpg.Pool
) -> None:
    await insert_operation(pool, OPERATION, "QUEUED")
    response = await api.get(f"{URL}/events", headers=auth("alice"))
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert response.headers["Cache-Control"] == "no-store"

    first_id, first = await next_operation(response)
    assert first["state"] == "QUEUED"
    assert await read_event(response) == {"comment": "heartbeat"}

    await set_state(pool, "RUNNING")
    running_id, running = await next_operation(response)
    assert running["state"] == "RUNNING" and running_id > first_id

    await set_progress(pool, 7)
    progress_id, progressed = await next_operation(response)
    assert progressed["progress"]["messages_written"] == 7 and progress_id > running_id

    await set_state(pool, "FAILED")
    last_id, last = await next_operation(response)
    assert last["state"] == "FAILED" and last_id > progress_id
    assert await read_event(response) == {}
    await wait_for(lambda: waiters(api) == 0)


async def terminal_version(pool: asyncpg.Pool) -> int:
    """Take the operation from QUEUED to SUCCEEDED; return its version then."""
    await insert_operation(pool, OPERATION, "QUEUED")
    await set_state(pool, "SUCCEEDED")
    version = int(await pool.fetchval("SELECT version FROM operations WHERE operation_id = $1", OPERATION))
    assert version == 2
    return version


async def test_a_reconnect_with_the_terminal_version_is_204_even_at_the_cap(
    api: Client, auth: Auth, pool: asyncpg.Pool
) -> None:
    version = await terminal_version(pool)
    await insert_operation(pool, "op_held", "QUEUED")
    # Alice already holds both of her wait slots: nothing is left to wait for, so the cap does not apply.
    base = str(api.make_url(""))
    async with aiohttp.ClientSession(base_url=base) as held:
        polls = [
            asyncio.create_task(held.get("/v3/operations/op_held?wait=60", headers=auth("alice"))) for _ in range(2)
        ]
        await wait_for(lambda: api.app[WAIT_SLOTS].in_use == 2)

        seen = await api.get(f"{URL}/events", headers={**auth("alice"), "Last-Event-ID": str(version)})

        assert seen.status == 204
        assert seen.headers["Cache-Control"] == "no-store"
        assert await seen.read() == b""
        for poll in polls:
            poll.cancel()


@pytest.mark.parametrize("last_event_id", ["1", "1000", "999999", "-2", "junk", "2.0", ""])
async def test_a_reconnect_after_the_end_with_another_id_gets_the_terminal_state_then_the_end(
    api: Client, auth: Auth, pool: asyncpg.Pool, last_event_id: str
) -> None:
    version = await terminal_version(pool)

    behind = await api.get(f"{URL}/events", headers={**auth("alice"), "Last-Event-ID": last_event_id})

    assert behind.status == 200
    event_id, operation = await next_operation(behind)
    assert (event_id, operation["state"]) == (version, "SUCCEEDED")
    assert await read_event(behind) == {}


@pytest.mark.parametrize("order", ["terminal first", "terminal last"])
async def test_a_repeated_last_event_id_is_no_version(api: Client, auth: Auth, pool: asyncpg.Pool, order: str) -> None:
    version = await terminal_version(pool)
    ids = [str(version), "1"] if order == "terminal first" else ["1", str(version)]
    headers = CIMultiDict({**auth("alice")})
    for sent_id in ids:
        headers.add("Last-Event-ID", sent_id)

    behind = await api.get(f"{URL}/events", headers=headers)

    assert behind.status == 200
    event_id, operation = await next_operation(behind)
    assert (event_id, operation["state"]) == (version, "SUCCEEDED")
    assert await read_event(behind) == {}


async def test_waiters_are_answered_at_once_on_shutdown(settings: Settings, moto: MotoServer, auth: Auth) -> None:
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    try:
        await insert_operation(pool, OPERATION, "QUEUED")
    finally:
        await pool.close()
    async with configured_api(settings, moto) as client:
        await listen_now(client.app[CHANGES])
        loop = asyncio.get_running_loop()
        started = loop.time()
        poll = asyncio.create_task(client.get(f"{URL}?wait=60", headers=auth("alice")))
        await wait_for(lambda: waiters(client) == 1)
        await client.app.shutdown()
        response = await asyncio.wait_for(poll, 20)
        assert response.status == 200
        assert (await response.json())["state"] == "QUEUED"
        assert loop.time() - started < 30


async def test_a_change_made_while_the_listen_connection_is_down_still_ends_the_wait(
    api: Client, auth: Auth, pool: asyncpg.Pool
) -> None:
    await insert_operation(pool, OPERATION, "QUEUED")
    poll = asyncio.create_task(api.get(f"{URL}?wait=60", headers=auth("alice")))
    await wait_for(lambda: waiters(api) == 1)

    terminated = await pool.fetchval(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND query LIKE 'LISTEN %chatexport_operation_changes%'"
    )
    assert terminated == 1
    # Announced while nobody listens: the waiter learns of it by reading again, woken as missed when the
    # connection is lost and again when its LISTEN is back.
    await set_state(pool, "RUNNING")

    response = await asyncio.wait_for(poll, 20)
    assert (await response.json())["state"] == "RUNNING"
    # The connection comes back whether or not a waiter is left to listen for.
    await wait_for(lambda: api.app[CHANGES].connected)


@pytest.mark.parametrize("last_event_id", ["999999", "-1", "junk", "1e3", ""])
async def test_an_id_that_is_not_the_current_version_gets_the_state_at_once_then_every_change(
    api: Client, auth: Auth, pool: asyncpg.Pool, last_event_id: str
) -> None:
    await insert_operation(pool, OPERATION, "QUEUED")
    response = await api.get(f"{URL}/events", headers={**auth("alice"), "Last-Event-ID": last_event_id})

    # Before any heartbeat: the client that sent a version from the future learns the state at once.
    first = await read_event(response)
    assert (first["id"], json.loads(first["data"])["state"]) == ("1", "QUEUED")

    await set_state(pool, "RUNNING")
    assert (await next_operation(response))[1]["state"] == "RUNNING"
    await set_state(pool, "SUCCEEDED")
    assert (await next_operation(response))[1]["state"] == "SUCCEEDED"
    assert await read_event(response) == {}
    await wait_for(lambda: waiters(api) == 0)


async def test_an_id_at_the_current_version_gets_only_newer_changes(
    api: Client, auth: Auth, pool: asyncpg.Pool
) -> None:
    await insert_operation(pool, OPERATION, "QUEUED")
    response = await api.get(f"{URL}/events", headers={**auth("alice"), "Last-Event-ID": "1"})
    assert await read_event(response) == {"comment": "heartbeat"}  # the client has version 1 already

    await set_state(pool, "RUNNING")

    event_id, operation = await next_operation(response)
    assert (event_id, operation["state"]) == (2, "RUNNING")
    response.close()


async def test_a_change_is_read_once_for_all_the_long_polls_it_ends(
    settings: Settings, moto: MotoServer, auth: Auth, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    await insert_operation(pool, OPERATION, "QUEUED")
    reads = 0
    read_operation = status_monitor.read_operation

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await read_operation(*args, **kwargs)

    monkeypatch.setattr(status_monitor, "read_operation", counted)
    async with configured_api(settings, moto, wait_per_user_concurrency=50) as api:
        await listen_now(api.app[CHANGES])
        polls = [asyncio.create_task(api.get(f"{URL}?wait=60", headers=auth("alice"))) for _ in range(40)]
        await wait_for(lambda: waiters(api) == 40)
        before = reads

        await set_state(pool, "RUNNING")

        answers = await asyncio.wait_for(asyncio.gather(*polls), 20)
        assert [(await answer.json())["state"] for answer in answers] == ["RUNNING"] * 40
    assert reads - before == 1


@pytest.mark.parametrize("conditional", [False, True])
async def test_a_change_while_a_long_poll_subscribes_is_answered_at_once(
    settings: Settings,
    moto: MotoServer,
    auth: Auth,
    pool: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
    conditional: bool,
) -> None:
    await insert_operation(pool, OPERATION, "QUEUED")
    read_operation = status_monitor.read_operation
    reads = 0

    async def changed_after_the_first_read(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        if reads == 2:  # the poll's first read is done; it has not subscribed yet
            await set_state(pool, "RUNNING")
        return await read_operation(*args, **kwargs)

    async with configured_api(settings, moto) as api:
        await listen_now(api.app[CHANGES])
        etag = (await api.get(URL, headers=auth("alice"))).headers["ETag"]
        headers = {**auth("alice"), **({"If-None-Match": etag} if conditional else {})}
        reads = 0
        monkeypatch.setattr(status_monitor, "read_operation", changed_after_the_first_read)
        response = await asyncio.wait_for(api.get(f"{URL}?wait=60", headers=headers), 20)
        assert response.status == 200
        assert (await response.json())["state"] == "RUNNING"
