"""Counts, for the benchmark of what a small export costs (docs/benchmark.md: Benchmark, Counts), what one
process sends to Postgres and RabbitMQ, on the client side: every query asyncpg runs (its query logger),
split into transactions (``BEGIN``), other transaction control (``COMMIT``, ``ROLLBACK``, savepoints) and
statements; the notifications a ``LISTEN`` connection receives; the messages aio-pika publishes and the
deliveries it acknowledges; the CPU time of the garbage collector's passes. Python imports this module at
start-up only when its folder leads ``PYTHONPATH``, which the benchmark sets for the parts it starts; the
product never imports it. On SIGUSR1 the process writes its counts as JSON to ``<BENCH_COUNTS_DIR>/<pid>.json``.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

COUNTS: Counter[str] = Counter()
_CONTROL = ("COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")
# The collector's passes: when the one under way began, and the CPU milliseconds of all so far, both in the
# thread that runs them (an executor's threads work on meanwhile, without the GIL).
_pass_started = 0.0
_collector_ms = 0.0


def _count_query(record: Any) -> None:
    words = record.query.lstrip().split(None, 1)
    first = words[0].upper().rstrip(";") if words else ""
    COUNTS["round trips"] += 1
    if first == "BEGIN":
        COUNTS["transactions"] += 1
    elif first in _CONTROL:
        COUNTS["transaction control"] += 1
    else:
        COUNTS["statements"] += 1


def _time_collection(phase: str, info: dict[str, Any]) -> None:
    global _pass_started, _collector_ms
    if phase == "start":
        _pass_started = time.thread_time()
    else:
        _collector_ms += (time.thread_time() - _pass_started) * 1000


def _install() -> None:
    import aio_pika
    import asyncpg.connection

    connection_init = asyncpg.connection.Connection.__init__
    process_notification = asyncpg.connection.Connection._process_notification

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        connection_init(self, *args, **kwargs)
        self.add_query_logger(_count_query)

    def notified(self: Any, *args: Any, **kwargs: Any) -> None:
        COUNTS["notifications received"] += 1
        process_notification(self, *args, **kwargs)

    asyncpg.connection.Connection.__init__ = init
    asyncpg.connection.Connection._process_notification = notified
    _count_calls(aio_pika.Exchange, "publish", "broker messages published")
    _count_calls(aio_pika.IncomingMessage, "ack", "broker deliveries acknowledged")
    gc.callbacks.append(_time_collection)
    signal.signal(signal.SIGUSR1, _write)


def _count_calls(owner: type, name: str, counter: str) -> None:
    original = getattr(owner, name)

    async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        COUNTS[counter] += 1
        return await original(self, *args, **kwargs)

    setattr(owner, name, counted)


def _write(*_: object) -> None:
    folder = Path(os.environ["BENCH_COUNTS_DIR"])
    temporary = folder / f"{os.getpid()}.tmp"
    temporary.write_text(json.dumps({**COUNTS, "collector ms": _collector_ms}))
    temporary.replace(folder / f"{os.getpid()}.json")


if os.environ.get("BENCH_COUNTS_DIR"):
    _install()
