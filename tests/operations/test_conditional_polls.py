"""Conditional polls (docs/api.md: Operations, Conditional polls): the operation's weak ETag is its version,
``If-None-Match`` naming it gets ``304`` with the current ``Retry-After`` and ``Cache-Control``, after the same
ownership check, and a long poll with ``If-None-Match`` waits only while the caller holds the current version.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
from prometheus_client import REGISTRY

from chatexport.client.api import Api
from devtools.moto import MotoServer
from services.api.exporting.changes import CHANGES
from services.api.http.preconditions import tag_list_matches
from shared.repository.operation_view import REPRESENTATION_VIEW
from shared.settings import Settings
from tests.support import wait_for
from tests.support.api_calls import make_conversation
from tests.support.messages import Auth, Client, configured_api, listen_now
from tests.support.rows import insert_operation

pytestmark = pytest.mark.module_database

OPERATION = "op_conditional"
URL = f"/v3/operations/{OPERATION}"


@pytest.fixture
async def api(settings: Settings, moto: MotoServer) -> AsyncIterator[Client]:
    async with configured_api(settings, moto) as client:
        await listen_now(client.app[CHANGES])
        yield client


def not_modified() -> float:
    """The 304s the API processes of this test run answered to polls."""
    labels = {"method": "GET", "route": "/v3/operations/{operation_id}", "status": "304"}
    return REGISTRY.get_sample_value("chatexport_http_requests_total", labels) or 0.0


def waiters(api: Client) -> int:
    return int(api.app[CHANGES].waiters)


async def etag_of(api: Client, auth: Auth) -> str:
    response = await api.get(URL, headers=auth("alice"))
    assert response.status == 200
    etag: str = response.headers["ETag"]
    return etag


async def set_progress(pool: asyncpg.Pool, messages_written: int) -> None:
    await pool.execute(
        "UPDATE operations SET messages_written = $2 WHERE operation_id = $1", OPERATION, messages_written
    )


async def test_the_etag_is_the_weak_version_and_a_match_is_304(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    await insert_operation(pool, OPERATION, "RUNNING")
    version = await pool.fetchval("SELECT version FROM operations WHERE operation_id = $1", OPERATION)
    etag = await etag_of(api, auth)
    assert etag == f'W/"{version}"'

    for sent in (etag, f'"{version}"', f'W/"0", {etag}', "*"):
        response = await api.get(URL, headers={**auth("alice"), "If-None-Match": sent})
        assert response.status == 304, sent
        assert await response.read() == b""
        assert response.headers["ETag"] == etag
        assert response.headers["Cache-Control"] == "no-store"
        assert int(response.headers["Retry-After"]) >= 1

    for sent in ('W/"0"', "garbage", f"{etag}x"):
        response = await api.get(URL, headers={**auth("alice"), "If-None-Match": sent})
        assert response.status == 200, sent


async def test_any_change_of_a_field_is_a_200_with_a_new_etag(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    await insert_operation(pool, OPERATION, "RUNNING")
    etag = await etag_of(api, auth)
    await set_progress(pool, 7)
    response = await api.get(URL, headers={**auth("alice"), "If-None-Match": etag})
    assert response.status == 200
    assert (await response.json())["progress"]["messages_written"] == 7
    assert response.headers["ETag"] != etag


async def test_a_terminal_304_has_no_retry_after(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    await insert_operation(pool, OPERATION, "CANCELED")
    etag = await etag_of(api, auth)
    for query in ("", "?wait=60"):
        response = await asyncio.wait_for(api.get(URL + query, headers={**auth("alice"), "If-None-Match": etag}), 20)
        assert response.status == 304
        assert "Retry-After" not in response.headers
    assert waiters(api) == 0


async def test_a_stranger_with_a_matching_tag_gets_the_same_404(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    await insert_operation(pool, OPERATION, "RUNNING")
    etag = await etag_of(api, auth)
    missing = await api.get("/v3/operations/op_nobody", headers=auth("mallory"))
    for query in ("", "?wait=5"):
        stranger = await api.get(URL + query, headers={**auth("mallory"), "If-None-Match": etag})
        assert (stranger.status, await stranger.json()) == (404, await missing.json())
        assert "ETag" not in stranger.headers


async def test_a_conditional_long_poll_answers_200_as_soon_as_the_state_moves(
    api: Client, auth: Auth, pool: asyncpg.Pool
) -> None:
    await insert_operation(pool, OPERATION, "QUEUED")
    etag = await etag_of(api, auth)
    poll = asyncio.create_task(api.get(f"{URL}?wait=60", headers={**auth("alice"), "If-None-Match": etag}))
    await wait_for(lambda: waiters(api) == 1)

    await pool.execute("UPDATE operations SET state = 'RUNNING' WHERE operation_id = $1", OPERATION)

    response = await asyncio.wait_for(poll, 20)
    assert response.status == 200
    assert (await response.json())["state"] == "RUNNING"
    assert response.headers["ETag"] != etag


async def test_a_conditional_long_poll_with_nothing_changed_ends_in_304(
    api: Client, auth: Auth, pool: asyncpg.Pool
) -> None:
    await insert_operation(pool, OPERATION, "QUEUED")
    etag = await etag_of(api, auth)
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await asyncio.wait_for(api.get(f"{URL}?wait=1", headers={**auth("alice"), "If-None-Match": etag}), 20)
    assert loop.time() - started >= 1.0
    assert (response.status, response.headers["ETag"]) == (304, etag)
    assert int(response.headers["Retry-After"]) >= 1


async def test_progress_during_a_conditional_long_poll_is_a_200_at_the_deadline(
    api: Client, auth: Auth, pool: asyncpg.Pool
) -> None:
    await insert_operation(pool, OPERATION, "RUNNING")
    etag = await etag_of(api, auth)
    poll = asyncio.create_task(api.get(f"{URL}?wait=2", headers={**auth("alice"), "If-None-Match": etag}))
    await wait_for(lambda: waiters(api) == 1)

    await set_progress(pool, 3)

    # A 304 would tell the caller that what it holds is current; it is not.
    response = await asyncio.wait_for(poll, 20)
    assert response.status == 200
    assert (await response.json())["progress"]["messages_written"] == 3


async def test_a_conditional_long_poll_on_an_older_version_is_answered_at_once(
    api: Client, auth: Auth, pool: asyncpg.Pool
) -> None:
    await insert_operation(pool, OPERATION, "RUNNING")
    etag = await etag_of(api, auth)
    await set_progress(pool, 4)
    response = await asyncio.wait_for(api.get(f"{URL}?wait=60", headers={**auth("alice"), "If-None-Match": etag}), 20)
    assert response.status == 200
    assert (await response.json())["progress"]["messages_written"] == 4
    assert waiters(api) == 0


async def test_the_version_trigger_watches_every_column_of_the_representation(pool: asyncpg.Pool) -> None:
    """Every column of the view the representation is built from bumps the version, but the lease's, the
    fencing generation, the computed age and the version itself: a column added to the view without being
    added to the trigger is named here.
    """
    unwatched = {"generation", "lease_owner", "lease_expires_at", "age_seconds", "version"}
    columns = await pool.fetch(
        "SELECT column_name FROM information_schema.columns WHERE table_name = $1", REPRESENTATION_VIEW
    )
    names = {row["column_name"] for row in columns}
    assert unwatched <= names
    source = await pool.fetchval("SELECT pg_get_functiondef('operation_versioned'::regproc)")
    missing = [name for name in sorted(names - unwatched) if not re.search(rf"\bNEW\.{name}\b", source)]
    assert missing == []


@pytest.mark.parametrize(
    ("assignment", "bumps"),
    [
        ("result_size_bytes = 10", True),
        ("result_sha256 = 'ab'", True),
        ("result_message_count = 2", True),
        ("result_parts = '[]'", True),
        ("lease_expires_at = now() + interval '1 minute'", False),
        ("generation = generation + 1", False),
    ],
)
async def test_a_column_bumps_the_version_or_not(pool: asyncpg.Pool, assignment: str, bumps: bool) -> None:
    await insert_operation(pool, OPERATION, "RUNNING")
    before = await pool.fetchval("SELECT version FROM operations WHERE operation_id = $1", OPERATION)
    after = await pool.fetchval(
        f"UPDATE operations SET {assignment} WHERE operation_id = $1 RETURNING version", OPERATION
    )
    assert after == (before + 1 if bumps else before)


async def test_the_client_sends_the_tag_it_holds_and_keeps_its_copy_on_a_304(
    api: Client, auth: Auth, pool: asyncpg.Pool
) -> None:
    await insert_operation(pool, OPERATION, "RUNNING")
    before = not_modified()
    token = auth("alice")["Authorization"].removeprefix("Bearer ")
    async with Api(str(api.make_url("")), token) as client:
        first = await client.operation(OPERATION)
        again = await client.operation(OPERATION, wait_seconds=1)
        assert not_modified() == before + 1
        assert again == first
        await set_progress(pool, 9)
        moved = await client.operation(OPERATION)
    assert moved["progress"]["messages_written"] == 9
    assert not_modified() == before + 1


async def test_a_list_that_does_not_parse_names_nothing(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    await insert_operation(pool, OPERATION, "RUNNING")
    etag = await etag_of(api, auth)
    for sent in (f"{etag}, garbage", f"garbage, {etag}", f'{etag} "x"'):
        response = await api.get(URL, headers={**auth("alice"), "If-None-Match": sent})
        assert response.status == 200, sent


def test_a_long_run_of_spaces_is_parsed_in_linear_time() -> None:
    """A guard against a pattern that backtracks: the largest header aiohttp takes, 20 times, in well under
    the 20 s a quadratic parse took (a fault that stalls the api for every user, not a speed target).
    """
    hostile = '"a",' + " " * 8_000 + "x"
    started = time.perf_counter()
    assert not any(tag_list_matches(hostile, "a", weak=True) for _ in range(20))
    assert time.perf_counter() - started < 5


async def test_the_client_holds_the_submits_answer(api: Client, auth: Auth) -> None:
    await make_conversation(api, auth, "c-held", ["alice"])
    before = not_modified()
    token = auth("alice")["Authorization"].removeprefix("Bearer ")
    async with Api(str(api.make_url("")), token) as client:
        submitted = await client.submit("c-held", {"format": "jsonl"}, idempotency_key="k-held")
        # Nothing runs the export here: the first poll finds the version the 202 showed.
        polled = await client.operation(submitted.operation["operation_id"])
    assert not_modified() == before + 1
    assert polled["state"] == submitted.operation["state"] == "QUEUED"
