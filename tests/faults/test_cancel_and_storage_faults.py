"""Cancel in every state and racing completion, and S3 outages, on real processes (docs/api.md: Operations,
Cancel; States and failure model).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support import AMQP_URL, cloned_database
from tests.support.fault_harness import (
    SLOW_UPLOADS,
    UPLOAD_BYTES_PER_SECOND,
    Faulty,
    check_ended_correctly,
    make_conversation,
    running,
    uploading,
)

pytestmark = pytest.mark.e2e

RACE_ROUNDS = 50


@pytest.fixture
async def database_url(template_db: str) -> AsyncIterator[str]:
    async with cloned_database(template_db, "chatexport_f") as url:
        yield url


async def cancel(faulty: Faulty, user: str, operation_id: str) -> tuple[int, dict[str, object]]:
    response = await faulty.http.post(f"/v3/operations/{operation_id}/cancel", headers=faulty.auth(user))
    return response.status, await response.json()


async def test_cancel_while_queued_running_and_after_success(database_url: str, tmp_path: Path) -> None:
    # No worker at first, so that an operation stays QUEUED for as long as the test needs.
    async with running(tmp_path, database_url=database_url, amqp_url=AMQP_URL, workers=0, overrides=SLOW_UPLOADS) as f:
        await make_conversation(f, "c-big", ["alice"], messages=40_000, body_bytes=300)
        await make_conversation(f, "c-small", ["alice"], messages=20, body_bytes=10)
        fingerprint = await f.messages_fingerprint()

        queued = await f.submit("alice", "c-small", "queued-1")
        assert (await f.operation(queued))["state"] == "QUEUED"
        status, body = await cancel(f, "alice", queued)
        assert (status, body["state"]) == (202, "CANCEL_REQUESTED")

        f.system.start_part("worker", name="worker-1")
        f.proxy.throttle(UPLOAD_BYTES_PER_SECOND)
        running_op = await f.submit("alice", "c-big", "running-1")
        await uploading(f, running_op)
        status, body = await cancel(f, "alice", running_op)
        assert (status, body["state"]) == (202, "CANCEL_REQUESTED")
        f.proxy.throttle(None)

        done = await f.submit("alice", "c-small", "done-1")
        await f.wait_state(done, "SUCCEEDED")
        status, body = await cancel(f, "alice", done)
        assert (status, body["code"], body["state"]) == (409, "ALREADY_TERMINAL", "SUCCEEDED")

        expected = await f.expected("alice", "c-small")
        outcomes: dict[str, bytes | str] = {queued: "CANCELED", running_op: "CANCELED", done: expected}
        await check_ended_correctly(f, "alice", outcomes, fingerprint=fingerprint)
        assert (await cancel(f, "alice", queued))[0] == 200  # CANCELED: idempotent


async def test_cancel_while_waiting_for_a_retry(database_url: str, tmp_path: Path) -> None:
    slow_retries = {"CHATEXPORT_RETRY_BASE_SECONDS": "60", "CHATEXPORT_RETRY_CAP_SECONDS": "60"}
    async with running(tmp_path, database_url=database_url, amqp_url=AMQP_URL, overrides=slow_retries) as f:
        await make_conversation(f, "c-small", ["alice"], messages=20, body_bytes=10)
        fingerprint = await f.messages_fingerprint()
        f.proxy.block()
        operation_id = await f.submit("alice", "c-small", "retry-1")
        row = await f.wait_state(operation_id, "RETRY_AT")
        assert row["error_code"] == "STORAGE_UNAVAILABLE"

        status, body = await cancel(f, "alice", operation_id)
        assert (status, body["state"]) == (202, "CANCEL_REQUESTED")
        # The janitor finishes a cancellation nobody holds once it can clean S3.
        f.proxy.unblock()
        await check_ended_correctly(f, "alice", {operation_id: "CANCELED"}, fingerprint=fingerprint)


async def test_cancel_racing_completion_ends_succeeded_or_canceled_never_anything_else(
    database_url: str, tmp_path: Path
) -> None:
    async with running(tmp_path, database_url=database_url, amqp_url=AMQP_URL) as f:
        await make_conversation(f, "c-race", ["alice"], messages=300, body_bytes=100)
        fingerprint = await f.messages_fingerprint()
        expected = await f.expected("alice", "c-race")

        async def round_(number: int) -> tuple[str, int]:
            operation_id = await f.submit("alice", "c-race", f"race-{number}")
            # The cancel lands at a different point of the run in each round: after 0 to 49 polls of the
            # operation, from before a worker claims it to past its completion.
            for _ in range(number):
                await f.http.get(f"/v3/operations/{operation_id}", headers=f.auth("alice"))
            status, _ = await cancel(f, "alice", operation_id)
            return operation_id, status

        rounds = []
        for first in range(0, RACE_ROUNDS, 10):
            rounds += await asyncio.gather(*(round_(number) for number in range(first, first + 10)))
        outcomes: dict[str, bytes | str] = {}
        for operation_id, status in rounds:
            row = await f.wait_ended(operation_id)
            assert row["state"] in ("SUCCEEDED", "CANCELED"), dict(row)
            # A cancel that found SUCCEEDED was refused; one that was accepted can never end SUCCEEDED.
            assert status == (409 if row["state"] == "SUCCEEDED" else 202)
            outcomes[operation_id] = expected if row["state"] == "SUCCEEDED" else "CANCELED"
        await check_ended_correctly(f, "alice", outcomes, fingerprint=fingerprint)
        # Both ways the race can go did happen.
        assert set(map(type, outcomes.values())) == {bytes, str}, outcomes


async def test_a_short_s3_outage_is_retried_and_a_long_one_parks_until_an_admin_requeues(
    database_url: str, tmp_path: Path
) -> None:
    budget = {"CHATEXPORT_MAX_ATTEMPTS": "4", "CHATEXPORT_RETRY_BASE_SECONDS": "1"}
    async with running(tmp_path, database_url=database_url, amqp_url=AMQP_URL, overrides=budget) as f:
        await make_conversation(f, "c-small", ["alice"], messages=50, body_bytes=50)
        fingerprint = await f.messages_fingerprint()
        expected = await f.expected("alice", "c-small")

        f.proxy.block()
        short = await f.submit("alice", "c-small", "short-outage")
        row = await f.wait_state(short, "RETRY_AT")
        assert row["error_code"] == "STORAGE_UNAVAILABLE"
        assert row["retry_at"] is not None
        f.proxy.unblock()
        await f.wait_state(short, "SUCCEEDED")

        f.proxy.block()
        long = await f.submit("alice", "c-small", "long-outage")
        row = await f.wait_state(long, "FAILED_REPAIR")
        assert (row["error_code"], row["attempt"]) == ("STORAGE_UNAVAILABLE", 4)
        shown = await (await f.http.get(f"/v3/operations/{long}", headers=f.auth("alice"))).json()
        assert shown["error"]["code"] == "STORAGE_UNAVAILABLE"
        assert "requeue" in shown["error"]["message"]
        f.proxy.unblock()

        requeued = await f.http.post(f"/admin/operations/{long}/requeue", headers=f.auth("root", admin=True))
        assert requeued.status == 202
        await check_ended_correctly(f, "alice", {short: expected, long: expected}, fingerprint=fingerprint)


async def test_a_frozen_s3_ends_the_attempt_instead_of_holding_it(database_url: str, tmp_path: Path) -> None:
    # A server that accepts the connection and stops reading: the body's write blocks, and the client's
    # read timeout has not started yet. Only the upload's own deadline (5 s + 20 s for a 5 MiB part) ends it.
    frozen_store = {**SLOW_UPLOADS, "CHATEXPORT_S3_TIMEOUT_SECONDS": "5"}
    async with running(tmp_path, database_url=database_url, amqp_url=AMQP_URL, overrides=frozen_store) as f:
        await make_conversation(f, "c-big", ["alice"], messages=40_000, body_bytes=300)
        fingerprint = await f.messages_fingerprint()
        expected = await f.expected("alice", "c-big")
        f.proxy.throttle(UPLOAD_BYTES_PER_SECOND)
        operation_id = await f.submit("alice", "c-big", "frozen-1")
        await uploading(f, operation_id)

        f.system.group.send("moto", signal.SIGSTOP)
        try:
            row = await f.wait_state(operation_id, "RETRY_AT")
        finally:
            f.system.group.send("moto", signal.SIGCONT)
        f.proxy.throttle(None)

        assert row["error_code"] == "STORAGE_UNAVAILABLE"
        await check_ended_correctly(f, "alice", {operation_id: expected}, fingerprint=fingerprint)


# The janitor runs one pass at start-up and then not again within any test: whatever ends below, a worker
# ended it (docs/states.md: States and failure model, Cancel).
NO_JANITOR_PASSES = {"CHATEXPORT_JANITOR_INTERVAL_SECONDS": "3600"}
PROMPT_CANCEL_SECONDS = 30.0


async def test_a_cancel_of_work_nobody_holds_ends_without_a_janitor_pass(database_url: str, tmp_path: Path) -> None:
    overrides = {**NO_JANITOR_PASSES, "CHATEXPORT_RETRY_BASE_SECONDS": "600", "CHATEXPORT_RETRY_CAP_SECONDS": "600"}
    async with running(tmp_path, database_url=database_url, amqp_url=AMQP_URL, workers=0, overrides=overrides) as f:
        await make_conversation(f, "c-small", ["alice"], messages=20, body_bytes=10)
        fingerprint = await f.messages_fingerprint()
        queued = await f.submit("alice", "c-small", "queued-1")
        status, body = await cancel(f, "alice", queued)
        assert (status, body["state"]) == (202, "CANCEL_REQUESTED")
        assert (await f.operation(queued))["state"] == "CANCEL_REQUESTED"

        f.system.start_part("worker", name="worker-1")
        await f.wait_state(queued, "CANCELED", timeout=PROMPT_CANCEL_SECONDS)

        # A retry waiting ten minutes, whose first attempt recorded an artifact.
        f.proxy.block()
        waiting = await f.submit("alice", "c-small", "retry-1")
        row = await f.wait_state(waiting, "RETRY_AT")
        assert row["error_code"] == "STORAGE_UNAVAILABLE"
        f.proxy.unblock()
        status, body = await cancel(f, "alice", waiting)
        assert (status, body["state"]) == (202, "CANCEL_REQUESTED")
        await f.wait_state(waiting, "CANCELED", timeout=PROMPT_CANCEL_SECONDS)

        await check_ended_correctly(f, "alice", {queued: "CANCELED", waiting: "CANCELED"}, fingerprint=fingerprint)
        finished = await f.metrics("worker-1")
        assert finished["chatexport_cancellations_finished_total{by=worker}"] == 2
        assert (await f.metrics("janitor"))["chatexport_cancellations_finished_total{by=janitor}"] == 0
