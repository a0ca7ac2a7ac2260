"""Every part's monitoring endpoint (``shared.monitoring``) on the real servers, ``chatexport health``
against it, and the worker's and relay's endpoints while they run.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import aio_pika
import aiohttp
import asyncpg
import pytest
from prometheus_client import Counter

from devtools.servers import TcpProxy
from services.relay.main import serve as serve_relay
from services.worker.main import serve as serve_worker
from shared.monitoring import CHECK_TIMEOUT_SECONDS, Monitor, broker_check, database_check, serving, storage_check
from shared.settings import Settings
from tests.support import AMQP_URL, PG_SERVER, wait_for
from tests.support.api_calls import metric_samples
from tests.support.sockets import handed_socket, refusing_socket

SCRAPES = Counter("chatexport_test_scrape_refreshes_total", "Refreshes run by the monitoring test.")


@pytest.fixture
async def monitored(settings: Settings, pool: asyncpg.Pool, s3: Any) -> AsyncIterator[tuple[Monitor, str]]:
    """A monitor checking this test's database, broker and bucket, served on a free port: (monitor, base URL)."""
    connection = await aio_pika.connect_robust(settings.amqp_url)
    monitor = Monitor("test", needs=("database", "broker", "storage"))
    monitor.checks.update(
        database=database_check(pool),
        broker=broker_check(connection),
        storage=storage_check(s3, settings.s3_bucket),
    )
    try:
        async with serving(monitor, settings) as port:
            yield monitor, f"http://127.0.0.1:{port}"
    finally:
        await connection.close()


async def get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        body = await response.json() if "json" in response.content_type else await response.text()
        return response.status, body


async def test_ready_when_every_dependency_answers(monitored: tuple[Monitor, str]) -> None:
    _, base = monitored

    assert await get(f"{base}/healthz") == (200, {"status": "ok"})
    assert await get(f"{base}/readyz") == (
        200,
        {"status": "ready", "checks": {"database": "ok", "broker": "ok", "storage": "ok"}},
    )


async def test_not_ready_names_the_failing_check(monitored: tuple[Monitor, str], s3: Any) -> None:
    monitor, base = monitored
    monitor.checks["storage"] = storage_check(s3, "no-such-bucket-here")

    status, body = await get(f"{base}/readyz")

    assert status == 503
    assert body["code"] == "SERVICE_UNAVAILABLE"
    assert body["checks"] == {"database": "ok", "broker": "ok", "storage": "ClientError"}


async def test_a_dependency_not_opened_yet_is_not_ready(settings: Settings) -> None:
    monitor = Monitor("test", needs=("database",))
    async with serving(monitor, settings) as port:
        status, body = await get(f"http://127.0.0.1:{port}/readyz")

    assert (status, body["checks"]) == (503, {"database": "Starting"})


async def test_metrics_are_refreshed_before_each_scrape_and_served_when_a_refresh_fails(
    monitored: tuple[Monitor, str],
) -> None:
    monitor, base = monitored

    async def refresh() -> None:
        SCRAPES.inc()

    async def broken() -> None:
        raise ConnectionRefusedError

    monitor.before_scrape += [refresh, broken]
    first = await scrape(base)
    second = await scrape(base)

    assert second["chatexport_test_scrape_refreshes_total{}"] == first["chatexport_test_scrape_refreshes_total{}"] + 1


def run_health(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chatexport.cli", "health", *args], capture_output=True, text=True, timeout=60, env=env
    )


async def test_health_command_exits_0_when_ready_and_1_otherwise(monitored: tuple[Monitor, str], s3: Any) -> None:
    monitor, base = monitored

    ready = await asyncio.to_thread(run_health, "--url", f"{base}/readyz")
    monitor.checks["storage"] = storage_check(s3, "no-such-bucket-here")
    not_ready = await asyncio.to_thread(run_health, "--url", f"{base}/readyz")
    alive = await asyncio.to_thread(run_health, "--url", f"{base}/healthz")
    with refusing_socket() as silent:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/readyz"
        nobody = await asyncio.to_thread(run_health, "--url", url, "--timeout", "2")
    bad_url = await asyncio.to_thread(run_health, "--url", "file:///etc/passwd")

    assert (ready.returncode, not_ready.returncode, alive.returncode) == (0, 1, 0)
    assert '"storage": "ClientError"' in not_ready.stderr
    assert (nobody.returncode, bad_url.returncode) == (1, 2)
    assert "unreachable" in nobody.stderr


async def test_health_command_asks_the_probe_of_a_base_url(monitored: tuple[Monitor, str], s3: Any) -> None:
    monitor, base = monitored

    ready = await asyncio.to_thread(run_health, "--url", base)
    monitor.checks["storage"] = storage_check(s3, "no-such-bucket-here")  # not ready, but alive
    not_ready = await asyncio.to_thread(run_health, "--url", f"{base}/")
    alive = await asyncio.to_thread(run_health, "--url", f"{base}/", "--live")

    assert (ready.returncode, not_ready.returncode, alive.returncode) == (0, 1, 0)
    assert '"status": "ready"' in ready.stdout
    assert f"{base}/readyz: 503" in not_ready.stderr
    assert '"status": "ok"' in alive.stdout


async def test_health_command_asks_the_configured_monitoring_port(monitored: tuple[Monitor, str]) -> None:
    _, base = monitored
    port = base.rsplit(":", 1)[1]
    env = {"CHATEXPORT_METRICS_HOST": "0.0.0.0", "CHATEXPORT_METRICS_PORT": port, "PATH": ""}

    ready = await asyncio.to_thread(run_health, env=env)
    live = await asyncio.to_thread(run_health, "--live", env=env)

    assert (ready.returncode, live.returncode) == (0, 0)
    assert '"status": "ready"' in ready.stdout and '"status": "ok"' in live.stdout


async def scrape(base: str) -> dict[str, float]:
    """``base``/metrics (see ``metric_samples``)."""
    status, text = await get(f"{base}/metrics")
    assert status == 200
    return metric_samples(text)


async def serving_part(
    serve: Callable[..., Coroutine[Any, Any, None]], settings: Settings
) -> tuple[asyncio.Task[None], asyncio.Event, str]:
    """Start ``serve`` on a monitoring socket handed to it; return (task, stop event, monitoring base URL)."""
    fd, port = handed_socket()
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings.model_copy(update={"metrics_socket_fd": fd}), stop=stop))
    return task, stop, f"http://127.0.0.1:{port}"


async def test_worker_and_relay_are_ready_once_consuming(settings: Settings, s3: Any) -> None:
    worker, stop_worker, worker_base = await serving_part(serve_worker, settings)
    relay, stop_relay, relay_base = await serving_part(serve_relay, settings)
    try:

        async def ready(base: str) -> bool:
            try:
                return (await get(f"{base}/readyz"))[0] == 200
            except aiohttp.ClientConnectionError:
                return False

        await wait_for(lambda: ready(worker_base), timeout=30)
        await wait_for(lambda: ready(relay_base), timeout=30)
        worker_checks = (await get(f"{worker_base}/readyz"))[1]["checks"]
        relay_checks = (await get(f"{relay_base}/readyz"))[1]["checks"]
        assert set(worker_checks) == {"database", "broker", "storage", "consumer"}
        assert set(relay_checks) == {"database", "broker"}
        assert "chatexport_worker_exports_running{}" in await scrape(worker_base)
    finally:
        stop_worker.set()
        stop_relay.set()
        await asyncio.wait_for(asyncio.gather(worker, relay), 30)


async def test_readiness_answers_within_its_deadline_while_the_database_hangs(settings: Settings) -> None:
    # A pooled connection whose server stops answering mid-statement: handing it back gracefully would
    # wait for the cancel to be confirmed (up to the statement timeout) and the probe would answer late.
    host, port = PG_SERVER.removeprefix("postgresql://").split("@")[1].split(":")
    with TcpProxy(host, int(port)) as proxy:
        database = settings.database_url.rsplit("/", 1)[1]
        pool = await asyncpg.create_pool(
            f"postgresql://postgres@127.0.0.1:{proxy.port}/{database}", min_size=1, max_size=1, command_timeout=10
        )
        assert pool is not None
        monitor = Monitor("test", needs=("database",))
        monitor.checks["database"] = database_check(pool)
        try:
            assert (await monitor.readiness())["database"] == "ok"
            proxy.throttle(1)  # a byte a second: the server seems to hang
            started = time.monotonic()
            hung = await monitor.readiness()
            elapsed = time.monotonic() - started
        finally:
            proxy.throttle(None)
            pool.terminate()

    assert hung == {"database": "TimeoutError"}
    assert elapsed < CHECK_TIMEOUT_SECONDS + 2  # it took 12 s when the connection was released gracefully


async def test_a_hung_broker_turns_readiness_off_after_a_few_heartbeats_and_back_on(
    settings: Settings, s3: Any
) -> None:
    host, port = AMQP_URL.split("@")[1].split("/")[0].split(":")
    with TcpProxy(host, int(port)) as proxy:
        through_proxy = settings.model_copy(
            update={
                "amqp_url": AMQP_URL.replace(f"{host}:{port}", f"127.0.0.1:{proxy.port}"),
                "amqp_heartbeat_seconds": 1,
            }
        )
        relay, stop, base = await serving_part(serve_relay, through_proxy)

        async def status() -> int:
            try:
                return (await get(f"{base}/readyz"))[0]
            except aiohttp.ClientConnectionError:
                return 0

        try:
            await wait_for(lambda: _is(status(), 200), timeout=30)
            proxy.throttle(1)  # the broker seems to hang: no close, no answer
            await wait_for(lambda: _is(status(), 503), timeout=20)
            proxy.throttle(None)
            await wait_for(lambda: _is(status(), 200), timeout=60)
        finally:
            stop.set()
            await asyncio.wait_for(relay, 30)


async def _is(status: Awaitable[int], expected: int) -> bool:
    return await status == expected
