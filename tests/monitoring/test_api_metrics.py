"""The API's metrics move with what it answers: HTTP requests by route template and status, idempotency
replays and conflicts, authorization refusals by stage, downloads by outcome; and, read from its monitoring
endpoint, the long polls and event streams open and the refusals by each cap (docs/monitoring.md: Monitoring).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import asyncpg
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY

from services.api.app import init_app
from shared.settings import Settings
from tests.support import wait_for
from tests.support.api_calls import Headers, expect_problem, make_conversation, metric_samples, submit
from tests.support.exports import held_download
from tests.support.rows import insert_operation
from tests.support.sockets import handed_socket


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_requests_are_counted_by_route_template_and_status(api: Any, auth: Headers) -> None:
    route = "/v3/operations/{operation_id}"
    found_before = sample("chatexport_http_requests_total", method="GET", route=route, status="404")
    unmatched_before = sample("chatexport_http_requests_total", method="GET", route="unmatched", status="404")
    timed_before = sample("chatexport_http_request_duration_seconds_count", method="GET", route=route, status="404")

    for unknown in ("op_a", "op_b"):
        assert (await api.get(f"/v3/operations/{unknown}", headers=auth("alice"))).status == 404
    assert (await api.get("/no/such/route")).status == 404

    assert sample("chatexport_http_requests_total", method="GET", route=route, status="404") == found_before + 2
    assert (
        sample("chatexport_http_request_duration_seconds_count", method="GET", route=route, status="404")
        == timed_before + 2
    )
    # Every unknown path shares one label, so scanners cannot grow the label set.
    assert sample("chatexport_http_requests_total", method="GET", route="unmatched", status="404") == (
        unmatched_before + 1
    )


async def test_idempotency_replays_and_conflicts_are_counted(api: Any, auth: Headers) -> None:
    await make_conversation(api, auth, "c-metrics", ["alice"])
    replays = sample("chatexport_idempotency_replays_total")
    reused = sample("chatexport_idempotency_conflicts_total", code="IDEMPOTENCY_KEY_REUSED")

    assert (await submit(api, auth, "alice", "c-metrics", {"format": "jsonl"}, "k-1")).status == 202
    assert (await submit(api, auth, "alice", "c-metrics", {"format": "jsonl"}, "k-1")).status == 202
    assert (await submit(api, auth, "alice", "c-metrics", {"format": "jsonl", "after_seq": 1}, "k-1")).status == 409

    assert sample("chatexport_idempotency_replays_total") == replays + 1
    assert sample("chatexport_idempotency_conflicts_total", code="IDEMPOTENCY_KEY_REUSED") == reused + 1


async def test_refusals_at_submit_and_download_are_counted_by_stage(
    api: Any, auth: Headers, pool: asyncpg.Pool
) -> None:
    await make_conversation(api, auth, "c-refused", ["alice"])
    submit_refusals = sample("chatexport_authorization_refusals_total", stage="submit")
    download_refusals = sample("chatexport_authorization_refusals_total", stage="download")
    expired = sample("chatexport_downloads_total", outcome="RESULT_EXPIRED")
    revoked = sample("chatexport_downloads_total", outcome="ACCESS_REVOKED")

    assert (await submit(api, auth, "mallory", "c-refused", {"format": "jsonl"}, "k-1")).status == 404
    response = await submit(api, auth, "alice", "c-refused", {"format": "jsonl"}, "k-2")
    operation_id = (await response.json())["operation_id"]
    # Ended states written directly: what the download answers depends only on them (docs/api.md: Error codes).
    await pool.execute(
        "UPDATE operations SET state = 'SUCCEEDED', result_key = 'k', result_size_bytes = 0,"
        " result_sha256 = '', result_message_count = 0, result_expires_at = now() + interval '1 day'"
        " WHERE operation_id = $1",
        operation_id,
    )
    await pool.execute("DELETE FROM conversation_members WHERE conversation_id = 'c-refused'")
    assert (await api.get(f"/v3/exports/{operation_id}/result", headers=auth("alice"))).status == 403
    await pool.execute("UPDATE operations SET state = 'EXPIRED' WHERE operation_id = $1", operation_id)
    assert (await api.get(f"/v3/exports/{operation_id}/result", headers=auth("alice"))).status == 410

    assert sample("chatexport_authorization_refusals_total", stage="submit") == submit_refusals + 1
    assert sample("chatexport_authorization_refusals_total", stage="download") == download_refusals + 1
    assert sample("chatexport_downloads_total", outcome="ACCESS_REVOKED") == revoked + 1
    assert sample("chatexport_downloads_total", outcome="RESULT_EXPIRED") == expired + 1


@contextlib.asynccontextmanager
async def monitored_api(settings: Settings, **overrides: Any) -> AsyncIterator[tuple[TestClient[Any, Any], str]]:
    """The API on a local port with ``overrides`` to its settings, and the base URL of its monitoring endpoint."""
    fd, port = handed_socket()
    served = settings.model_copy(update={"metrics_socket_fd": fd, **overrides})
    async with TestClient(TestServer(init_app(served))) as client:
        yield client, f"http://127.0.0.1:{port}"


async def scrape(base: str) -> dict[str, float]:
    """The samples ``base``/metrics serves (``tests.support.api_calls.metric_samples``)."""
    async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as response:
        assert response.status == 200
        return metric_samples(await response.text())


def waiting(kind: str) -> str:
    return f"chatexport_api_waiting_requests{{kind={kind}}}"


def refused(cap: str) -> str:
    return f"chatexport_api_cap_refusals_total{{cap={cap}}}"


async def moved(metrics: str, since: dict[str, float], expected: Mapping[str, float]) -> bool:
    """True when each sample named in ``expected`` is now that much above its value in ``since``."""
    now = await scrape(metrics)
    return all(now[name] - since[name] == delta for name, delta in expected.items())


async def test_open_long_polls_and_event_streams_are_gauged(
    settings: Settings, pool: asyncpg.Pool, auth: Headers
) -> None:
    await insert_operation(pool, "op_watched", "QUEUED")
    alice = auth("alice")
    async with (
        monitored_api(settings, wait_per_user_concurrency=200) as (api, metrics),
        # The test client's own session opens at most 100 connections at once.
        aiohttp.ClientSession(str(api.make_url("")), connector=aiohttp.TCPConnector(limit=0)) as http,
    ):
        before = await scrape(metrics)
        # 100 of each open at once on one process.
        polls = [asyncio.create_task(http.get("/v3/operations/op_watched?wait=60", headers=alice)) for _ in range(100)]
        try:
            streams = await asyncio.gather(
                *(http.get("/v3/operations/op_watched/events", headers=alice) for _ in range(100))
            )
            assert await wait_for(
                lambda: moved(metrics, before, {waiting("long_poll"): 100, waiting("event_stream"): 100})
            )
            for stream in streams:
                stream.close()
            assert await wait_for(
                lambda: moved(metrics, before, {waiting("long_poll"): 100, waiting("event_stream"): 0})
            )
        finally:
            for poll in polls:
                poll.cancel()
        assert await wait_for(lambda: moved(metrics, before, {waiting("long_poll"): 0, waiting("event_stream"): 0}))


async def test_refusals_are_counted_by_the_cap_that_refused_them(
    settings: Settings, pool: asyncpg.Pool, s3: Any, auth: Headers
) -> None:
    # Far more than the socket buffers hold: a download whose client does not read keeps its slot.
    data = b"x" * 24_000_000
    key = "exports/op_alice/g1.jsonl"
    await s3.put_object(Bucket=settings.s3_bucket, Key=key, Body=data)
    now = dt.datetime.now(dt.UTC)
    result = {
        "result_key": key,
        "result_size_bytes": len(data),
        "result_sha256": hashlib.sha256(data).hexdigest(),
        "result_message_count": 0,
        "result_expires_at": now + dt.timedelta(days=1),
        "finished_at": now,
    }
    for user in ("alice", "bob"):
        await insert_operation(pool, f"op_{user}", "SUCCEEDED", owner_id=user, **result)
        await insert_operation(pool, f"op_{user}_waited", "QUEUED", owner_id=user)
    caps = ("wait_concurrency", "wait_per_user_concurrency", "download_concurrency", "download_per_user_concurrency")
    async with monitored_api(settings, **dict.fromkeys(caps, 1)) as (api, metrics):
        await make_conversation(api, auth, "c-a", ["alice", "bob"])
        before = await scrape(metrics)
        poll = asyncio.create_task(api.get("/v3/operations/op_alice_waited?wait=60", headers=auth("alice")))
        try:
            async with held_download(api, "/v3/exports/op_alice/result", auth("alice")["Authorization"]):
                held = {waiting("long_poll"): 1, "chatexport_api_downloads_streaming{}": 1}
                assert await wait_for(lambda: moved(metrics, before, held))
                # Alice is at both of her caps, and with her slots the process is at both of its own.
                for user, path, status, code in (
                    ("alice", "/v3/operations/op_alice_waited/events", 429, "TOO_MANY_WAITERS"),
                    ("bob", "/v3/operations/op_bob_waited?wait=60", 503, "SERVICE_UNAVAILABLE"),
                    ("alice", "/v3/exports/op_alice/result", 429, "TOO_MANY_DOWNLOADS"),
                    ("bob", "/v3/exports/op_bob/result", 503, "SERVICE_UNAVAILABLE"),
                ):
                    await expect_problem(await api.get(path, headers=auth(user)), status, code)
        finally:
            poll.cancel()
        after = await scrape(metrics)

    assert {cap: after[refused(cap)] - before[refused(cap)] for cap in caps} == dict.fromkeys(caps, 1)
