"""Benchmark: what tracing costs the api (docs/benchmark.md: Benchmark, Tracing). Polls and submits per
second, under ``wrk -t1 -c32``, of three api processes of one system in one run:

- tracing off: no OTLP endpoint, the default;
- OpenTelemetry not imported: the same, with a package first on ``PYTHONPATH`` that makes
  ``import opentelemetry`` fail, so the process proves that the off path never touches it;
- tracing on: an endpoint (an OTLP receiver in this process) and every trace sampled.

Each is measured alone, every other part SIGSTOPped; the three take turns for each kind of request, for
``ROUNDS`` rounds, and the best of each is kept, so a disturbance of one turn (a checkpoint of the shared
database, say) does not decide. Needs ``wrk``. Usage:

    .venv/bin/python bench/tracing_cost.py [--seconds N]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.http_load import SETTINGS, lua_requests, poll_requests, prepare, submit_requests, wrk
from bench.running import running_system
from bench.table import Figure, print_table
from devtools.localsystem import LocalSystem

ROUNDS = 3
MODES = ("off", "not imported", "on")
BLOCKER = 'raise ImportError("OpenTelemetry is not importable in this benchmark run")\n'


class SpanCounter:
    """An OTLP/HTTP receiver that counts the spans it is sent."""

    def __init__(self) -> None:
        self.spans = 0

    async def receive(self, request: web.Request) -> web.Response:
        """``POST /v1/traces``: count, answer 200 with an empty response."""
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        self.spans += sum(len(scope.spans) for each in message.resource_spans for scope in each.scope_spans)
        return web.Response(body=b"", content_type="application/x-protobuf")


@asynccontextmanager
async def counting_receiver() -> AsyncIterator[tuple[SpanCounter, str]]:
    """A ``SpanCounter`` listening on a free port for the block; yields it and its endpoint URL."""
    counter = SpanCounter()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", counter.receive)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield counter, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def start_apis(system: LocalSystem, endpoint: str, blocker: Path) -> dict[str, str]:
    """Start the "not imported" and "on" api processes beside the system's own ("off"); return each mode's
    base URL.
    """
    urls = {"off": system.base_url}
    extra = {
        "not imported": {"PYTHONPATH": str(blocker)},
        "on": {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_SAMPLER_ARG": "1.0"},
    }
    for mode, env in extra.items():
        name = f"api-{mode.replace(' ', '-')}"
        system.start_part("api", name=name, extra_env=env)
        system.wait_ready([name])
        urls[mode] = system.api_url(name)
    return urls


def measure(
    system: LocalSystem, urls: dict[str, str], prepared: list[tuple[str, str, str]], seconds: int
) -> dict[tuple[str, str], float]:
    """The best requests per second of each (mode, "poll" | "submit") over ``ROUNDS`` alternating rounds."""
    polls, submits = poll_requests(prepared), submit_requests(prepared)
    names = {"off": "api", "not imported": "api-not-imported", "on": "api-on"}
    scripts = {"poll": lua_requests("GET", polls), "submit": lua_requests("POST", submits, "{}", unique_key=True)}
    best: dict[tuple[str, str], float] = {}
    # The three modes back to back for each kind: the database's state (its checkpoints, the outbox the
    # paused relay leaves growing) drifts between kinds and rounds more than within them.
    for _ in range(ROUNDS):
        for kind, script in scripts.items():
            for mode in MODES:
                others = [name for name in system.group.pids() if name not in (names[mode], "moto")]
                with system.group.paused(others):
                    load = wrk(urls[mode], script, seconds)
                assert load.non_2xx == 0, (mode, kind, load)
                print(f"{mode:<13} {kind:<7} {load.requests_per_second:>9,.0f} req/s  p50 {load.p50_ms:.1f} ms")
                best[mode, kind] = max(best.get((mode, kind), 0.0), load.requests_per_second)
    return best


async def figures(seconds: int) -> list[Figure]:
    """Start a system and the two other api processes, prepare it, and measure (see the module's docstring)."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")
    blocker = Path(tempfile.mkdtemp())
    (blocker / "opentelemetry").mkdir()
    (blocker / "opentelemetry" / "__init__.py").write_text(BLOCKER)
    async with counting_receiver() as (counter, endpoint), running_system(workers=2, overrides=SETTINGS) as system:
        prepared = await prepare(system)
        urls = start_apis(system, endpoint, blocker)
        best = await asyncio.to_thread(measure, system, urls, prepared, seconds)
        # Spans still buffered are flushed within the exporter's interval; some must have arrived by now.
        assert counter.spans > 0, "tracing on sent no span"
        print(f"spans received from the traced api: {counter.spans:,}")
    rows = []
    for kind, name in (("poll", "GET /v3/operations/{id}"), ("submit", "POST .../exports")):
        rows += [
            Figure(f"{name}, tracing off", best["off", kind], "req/s", best["not imported", kind],
                   "OpenTelemetry not imported", ">= 0.97"),
            Figure(f"{name}, tracing on, every trace sampled", best["on", kind], "req/s",
                   best["not imported", kind], "OpenTelemetry not imported", "reported"),
        ]  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    print_table(asyncio.run(figures(parser.parse_args().seconds)))


if __name__ == "__main__":
    main()
