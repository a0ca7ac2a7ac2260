"""The admin view of an operation (``GET /admin/operations/{id}``) and the history behind it: one attempt per claim,
closed by the write that ends it (docs/states.md: States and failure model, Attempts), and an access event for every
download attempt and result deletion (docs/api.md: Downloads, Access events), on the real Postgres, RabbitMQ and a
moto server.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from services.api.app import init_app
from services.janitor.janitor import Janitor
from services.worker.operation.runner import LeaseRunner
from shared.repair import requeue
from shared.repository import leases
from shared.repository.artifacts import ArtifactFiles
from shared.repository.leases import ClaimedOperation, SucceedOutcome
from shared.settings import Settings
from shared.storage import artifact_key
from tests.support import claims
from tests.support.api_calls import (
    expect_problem,
    import_lines,
    make_conversation,
    running_pipeline,
    submit,
    wait_terminal,
)
from tests.support.exports import GUESSED_ID, REPRESENTATION_KEYS, TIMESTAMP, Auth, Client, download_events
from tests.support.rows import insert_operation

pytestmark = pytest.mark.module_database

LEASE = 30.0
ADMIN_KEYS = {
    "owner_id",
    "generation",
    "lease_owner",
    "lease_expires_at",
    "finished_at",
    "result_expires_at",
    "attempts",
    "artifacts",
    "access_events",
    "access_events_total",
    "webhook_deliveries",
    "chunks",
}
# The worker of ``running_pipeline`` runs in this process and names itself so in the lease.
PIPELINE_WORKER = f"{socket.gethostname()}:{os.getpid()}"


async def admin_view(api: Client, auth: Auth, operation_id: str) -> dict[str, Any]:
    response = await api.get(f"/admin/operations/{operation_id}", headers=auth("root", admin=True))
    assert response.status == 200, await response.text()
    assert response.headers["Cache-Control"] == "no-store"
    body: dict[str, Any] = await response.json()
    return body


async def submitted(api: Client, auth: Auth, cid: str) -> str:
    """``cid`` with members alice and bob and three messages, and alice's export of it submitted (no
    pipeline runs yet); return the operation id.
    """
    await make_conversation(api, auth, cid, ["alice", "bob"])
    lines = [{"message_id": f"m{n}", "sender_id": "alice", "body": "hi"} for n in range(3)]
    await import_lines(api, auth, cid, lines)
    response = await submit(api, auth, "alice", cid, {"format": "jsonl"}, "k-1")
    assert response.status == 202, await response.text()
    operation_id: str = (await response.json())["operation_id"]
    return operation_id


async def until_terminal(api: Client, auth: Auth, operation_id: str) -> dict[str, Any]:
    return await wait_terminal(api, auth, "alice", f"/v3/operations/{operation_id}")


def attempt_summary(view: dict[str, Any]) -> list[tuple[Any, ...]]:
    """(generation, attempt, worker_id, outcome, error_code) of each attempt, checking its timestamps."""
    for attempt in view["attempts"]:
        assert TIMESTAMP.match(attempt["claimed_at"]), attempt
        assert (attempt["ended_at"] is None) == (attempt["outcome"] is None), attempt
        assert attempt["ended_at"] is None or attempt["claimed_at"] <= attempt["ended_at"], attempt
    return [
        (item["generation"], item["attempt"], item["worker_id"], item["outcome"], item["error_code"])
        for item in view["attempts"]
    ]


async def test_a_successful_export_shows_one_succeeded_attempt_and_its_published_artifact(
    api: Client, auth: Auth, settings: Settings, pipeline: None
) -> None:
    operation_id = await submitted(api, auth, "c-ok")
    public = await until_terminal(api, auth, operation_id)
    assert public["state"] == "SUCCEEDED", public

    view = await admin_view(api, auth, operation_id)

    assert view.keys() == REPRESENTATION_KEYS | ADMIN_KEYS
    assert {key: view[key] for key in public} == public
    assert (view["owner_id"], view["generation"], view["attempt"]) == ("alice", 1, 1)
    assert (view["lease_owner"], view["lease_expires_at"]) == (None, None)
    assert TIMESTAMP.match(view["finished_at"])
    assert view["result_expires_at"] == public["result"]["expires_at"]
    assert attempt_summary(view) == [(1, 1, PIPELINE_WORKER, "SUCCEEDED", None)]
    result = public["result"]
    [artifact] = view["artifacts"]
    assert artifact == {
        "generation": 1,
        "object_key": artifact_key(settings, operation_id, 1, extension="jsonl", split=False),
        "state": "PUBLISHED",
        "upload_id": None,
        "size_bytes": result["size_bytes"],
        "sha256": result["sha256"],
        "message_count": 3,
        "created_at": artifact["created_at"],
        "updated_at": artifact["updated_at"],
    }
    assert TIMESTAMP.match(artifact["created_at"]) and TIMESTAMP.match(artifact["updated_at"])
    # Object keys only: nothing a client could fetch the file with.
    text = json.dumps(view)
    assert "http" not in text and "Signature" not in text and "X-Amz" not in text
    assert (view["access_events"], view["access_events_total"]) == ([], 0)


async def test_a_takeover_shows_the_lost_generation_and_its_holder_cannot_rewrite_it(
    api: Client, auth: Auth, pool: asyncpg.Pool, settings: Settings, s3: Any
) -> None:
    operation_id = await submitted(api, auth, "c-take")
    # A worker claims generation 1, then freezes until its lease has expired.
    async with pool.acquire() as conn:
        frozen = await claims.claim(conn, operation_id, "w-frozen", lease_seconds=LEASE)
        await conn.execute("UPDATE operations SET lease_expires_at = now() - interval '1 second'")
    running = await admin_view(api, auth, operation_id)
    assert (running["state"], running["lease_owner"], running["generation"]) == ("RUNNING", "w-frozen", 1)
    assert TIMESTAMP.match(running["lease_expires_at"])
    assert attempt_summary(running) == [(1, 1, "w-frozen", None, None)]

    async with running_pipeline(settings):
        assert (await until_terminal(api, auth, operation_id))["state"] == "SUCCEEDED"
    view = await admin_view(api, auth, operation_id)
    assert (view["generation"], view["attempt"]) == (2, 2)
    expected = [(1, 1, "w-frozen", "LEASE_LOST", None), (2, 2, PIPELINE_WORKER, "SUCCEEDED", None)]
    assert attempt_summary(view) == expected
    # Generation 1's claim recorded its artifact; the takeover removed it before writing its own.
    assert [(item["generation"], item["state"]) for item in view["artifacts"]] == [(1, "DELETED"), (2, "PUBLISHED")]

    # The frozen worker wakes up and runs its lease: every write of generation 1 is fenced off.
    await LeaseRunner(pool=pool, s3=s3, settings=settings).run(frozen)
    again = await admin_view(api, auth, operation_id)
    assert again["attempts"] == view["attempts"]
    assert (again["state"], again["generation"]) == ("SUCCEEDED", 2)


async def test_downloads_granted_or_refused_and_the_expiry_are_access_events(
    api: Client, auth: Auth, pool: asyncpg.Pool, settings: Settings, s3: Any
) -> None:
    operation_id = await submitted(api, auth, "c-dl")
    url = f"/v3/exports/{operation_id}/result"
    admin = auth("root", admin=True)
    await expect_problem(await api.get(url, headers=auth("alice")), 409, "RESULT_NOT_READY")

    async with running_pipeline(settings):
        assert (await until_terminal(api, auth, operation_id))["state"] == "SUCCEEDED"
    granted = await api.get(url, headers=auth("alice"))
    assert granted.status == 200
    await granted.read()
    await expect_problem(await api.get(url, headers=auth("bob")), 404, "NOT_FOUND")
    assert (await api.delete("/admin/conversations/c-dl/members/alice", headers=admin)).status == 204
    await expect_problem(await api.get(url, headers=auth("alice")), 403, "ACCESS_REVOKED")
    assert (await api.put("/admin/conversations/c-dl/members/alice", headers=admin)).status == 204
    await pool.execute(
        "UPDATE operations SET result_expires_at = now() - interval '1 second' WHERE operation_id = $1", operation_id
    )
    assert await Janitor(pool=pool, s3=s3, settings=settings).expire_results() == 1
    await expect_problem(await api.get(url, headers=auth("alice")), 410, "RESULT_EXPIRED")

    view = await admin_view(api, auth, operation_id)
    events = view["access_events"]
    assert [(event["user_id"], event["action"], event["outcome"]) for event in events] == [
        ("alice", "download", "RESULT_NOT_READY"),
        ("alice", "download", "GRANTED"),
        ("bob", "download", "NOT_FOUND"),
        ("alice", "download", "ACCESS_REVOKED"),
        ("alice", "delete_result", "EXPIRED"),
        ("alice", "download", "RESULT_EXPIRED"),
    ]
    times = [event["occurred_at"] for event in events]
    assert all(TIMESTAMP.match(time) for time in times) and times == sorted(times)
    assert view["access_events_total"] == len(events)
    assert view["state"] == "EXPIRED"
    assert [(item["generation"], item["state"]) for item in view["artifacts"]] == [(1, "DELETED")]


async def test_downloads_that_storage_fails_are_access_events(
    api: Client, auth: Auth, pool: asyncpg.Pool, settings: Settings, s3: Any, pipeline: None
) -> None:
    operation_id = await submitted(api, auth, "c-s3")
    assert (await until_terminal(api, auth, operation_id))["state"] == "SUCCEEDED"
    url = f"/v3/exports/{operation_id}/result"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    unreachable = settings.model_copy(
        update={"s3_endpoint_url": f"http://127.0.0.1:{closed_port}", "s3_timeout_seconds": 2.0}
    )
    async with TestClient(TestServer(init_app(unreachable))) as cut_off:
        await expect_problem(await cut_off.get(url, headers=auth("alice")), 503, "SERVICE_UNAVAILABLE")
    await s3.delete_object(
        Bucket=settings.s3_bucket, Key=artifact_key(settings, operation_id, 1, extension="jsonl", split=False)
    )
    await expect_problem(await api.get(url, headers=auth("alice")), 500, "INTERNAL")

    assert await download_events(pool, operation_id) == [("alice", "SERVICE_UNAVAILABLE"), ("alice", "INTERNAL")]


async def test_the_admin_view_needs_the_admin_scope_and_a_known_well_formed_id(
    api: Client, auth: Auth, pool: asyncpg.Pool
) -> None:
    await insert_operation(pool, "op_1", "QUEUED")
    await expect_problem(await api.get("/admin/operations/op_1"), 401, "UNAUTHENTICATED")
    await expect_problem(await api.get("/admin/operations/op_1", headers=auth("alice")), 403, "FORBIDDEN")
    admin = auth("root", admin=True)
    await expect_problem(await api.get(f"/admin/operations/{GUESSED_ID}", headers=admin), 404, "NOT_FOUND")
    for malformed in ("op%00", "o" * 65, "op%20x", "op.1"):
        body = await expect_problem(
            await api.get(f"/admin/operations/{malformed}", headers=admin), 422, "VALIDATION_FAILED", case=malformed
        )
        assert [error["loc"] for error in body["errors"]] == [["path", "operation_id"]], malformed
    queued = await admin_view(api, auth, "op_1")
    assert (queued["state"], queued["attempts"], queued["artifacts"]) == ("QUEUED", [], [])
    assert queued["progress"]["phase"] == "waiting"


Ending = Callable[[asyncpg.Connection, ClaimedOperation], Awaitable[bool]]


def _end_attempt(state: str, code: str, delay: float | None = None) -> Ending:
    def end(conn: asyncpg.Connection, claimed: ClaimedOperation) -> Awaitable[bool]:
        return leases.end_attempt(
            conn,
            operation_id="op_1",
            generation=claimed.generation,
            state=state,
            error_code=code,
            error_message="m",
            retry_delay_seconds=delay,
        )

    return end


def files_of(generation: int) -> ArtifactFiles:
    digest = hashlib.sha256(b"").hexdigest()
    return ArtifactFiles.one_file(f"exports/op_1/g{generation}.jsonl", size_bytes=0, sha256=digest, message_count=0)


async def _succeed(conn: asyncpg.Connection, claimed: ClaimedOperation) -> bool:
    outcome = await leases.succeed_export(
        conn,
        claimed=claimed,
        files=files_of(claimed.generation),
        artifact_generation=claimed.generation,
        result_ttl_seconds=60,
    )
    # Like every other ending, refused only because the lease or the state moved on: the owner is a member and
    # the file verified (``holding``).
    assert outcome in {SucceedOutcome.SUCCEEDED, SucceedOutcome.LEASE_LOST}, outcome
    return outcome is SucceedOutcome.SUCCEEDED


def _hand_back(conn: asyncpg.Connection, claimed: ClaimedOperation) -> Awaitable[bool]:
    return leases.hand_back(conn, operation_id="op_1", generation=claimed.generation)


def _finish_cancel(conn: asyncpg.Connection, claimed: ClaimedOperation) -> Awaitable[bool]:
    return leases.finish_cancel(conn, operation_id="op_1", generation=claimed.generation, abandoned=False)


async def parked(conn: asyncpg.Connection) -> bool:
    """Whether a wake-up's claim, with one attempt for the whole budget, parked op_1."""
    claim = await claims.claim_export(conn, "op_1", "w-next", lease_seconds=LEASE, max_attempts=1)
    return claim.parked


def _park(conn: asyncpg.Connection, claimed: ClaimedOperation) -> Awaitable[bool]:
    return parked(conn)


def _janitor_cancel(conn: asyncpg.Connection, claimed: ClaimedOperation) -> Awaitable[bool]:
    return leases.finish_cancel(conn, operation_id="op_1", generation=claimed.generation, abandoned=True)


EXPIRED_LEASE = "UPDATE operations SET lease_expires_at = now() - interval '1 second'"
CANCEL_REQUESTED = "UPDATE operations SET state = 'CANCEL_REQUESTED'"
ENDINGS: dict[str, tuple[str | None, Ending, str, str | None]] = {
    # name: (what happened meanwhile, the ending write, the attempt's outcome, its error code)
    "retry": (None, _end_attempt("RETRY_AT", "STORAGE_UNAVAILABLE", 5.0), "RETRY_AT", "STORAGE_UNAVAILABLE"),
    "failed": (None, _end_attempt("FAILED", "ACCESS_REVOKED"), "FAILED", "ACCESS_REVOKED"),
    "budget spent": (None, _end_attempt("FAILED_REPAIR", "TIMEOUT"), "FAILED_REPAIR", "TIMEOUT"),
    "succeeded": (None, _succeed, "SUCCEEDED", None),
    "handed back": (None, _hand_back, "HANDED_BACK", None),
    "canceled by the holder": (CANCEL_REQUESTED, _finish_cancel, "CANCELED", None),
    "parked: worker lost": (EXPIRED_LEASE, _park, "LEASE_LOST", "WORKER_LOST"),
    "canceled by the janitor": (f"{CANCEL_REQUESTED}; {EXPIRED_LEASE}", _janitor_cancel, "LEASE_LOST", None),
}


ENDED_AT = "SELECT ended_at FROM attempts WHERE operation_id = 'op_1'"


async def attempt_rows(conn: asyncpg.Connection) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(
        "SELECT generation, attempt, worker_id, outcome, error_code, ended_at IS NOT NULL AS ended"
        " FROM attempts WHERE operation_id = 'op_1' ORDER BY generation"
    )
    return [tuple(row) for row in rows]


async def claimed(conn: asyncpg.Connection, worker_id: str) -> ClaimedOperation:
    return await claims.claim(conn, "op_1", worker_id, lease_seconds=LEASE)


async def queued_for_a_member(pool: asyncpg.Pool) -> None:
    """op_1 queued, its owner alice a member of its conversation c-a."""
    await pool.execute("INSERT INTO conversations (conversation_id) VALUES ('c-a')")
    await pool.execute("INSERT INTO conversation_members (conversation_id, user_id) VALUES ('c-a', 'alice')")
    await insert_operation(pool, "op_1", "QUEUED")


async def holding(conn: asyncpg.Connection, worker_id: str) -> ClaimedOperation:
    """op_1 claimed by ``worker_id``, whose file is written and verified: whether a SUCCEEDED may follow then
    turns on the lease and the state alone.
    """
    claim = await claimed(conn, worker_id)
    await claims.verified_artifact(conn, claim, files_of(claim.generation))
    return claim


@pytest.mark.parametrize("name", list(ENDINGS))
async def test_the_write_that_ends_an_attempt_closes_its_row_once(pool: asyncpg.Pool, name: str) -> None:
    meanwhile, ending, outcome, error_code = ENDINGS[name]
    await queued_for_a_member(pool)
    async with pool.acquire() as conn:
        claim = await holding(conn, "w1")
        assert await attempt_rows(conn) == [(1, 1, "w1", None, None, False)]
        if meanwhile is not None:
            await conn.execute(meanwhile)

        assert await ending(conn, claim)
        closed = await attempt_rows(conn)
        assert closed == [(1, 1, "w1", outcome, error_code, True)]
        ended_at = await conn.fetchval(ENDED_AT)
        # Written again (a hand back of an expired lease still matches), the closed row stays as it is.
        await ending(conn, claim)
        assert await attempt_rows(conn) == closed
        assert await conn.fetchval(ENDED_AT) == ended_at


@pytest.mark.parametrize("name", [name for name in ENDINGS if name != "parked: worker lost"])
async def test_a_superseded_generation_cannot_close_the_attempt_of_the_next(pool: asyncpg.Pool, name: str) -> None:
    meanwhile, ending, _, _ = ENDINGS[name]
    await queued_for_a_member(pool)
    async with pool.acquire() as conn:
        old = await holding(conn, "w1")
        await conn.execute(EXPIRED_LEASE)
        await claimed(conn, "w2")
        expected = [(1, 1, "w1", "LEASE_LOST", None, True), (2, 2, "w2", None, None, False)]
        assert await attempt_rows(conn) == expected
        if meanwhile is not None:
            await conn.execute(meanwhile)

        assert not await ending(conn, old)
        assert await attempt_rows(conn) == expected


async def test_a_requeued_or_handed_back_operation_gets_a_new_attempt_row(pool: asyncpg.Pool) -> None:
    await insert_operation(pool, "op_1", "QUEUED")
    async with pool.acquire() as conn:
        first = await claimed(conn, "w1")
        assert await leases.hand_back(conn, operation_id="op_1", generation=first.generation)
        # A handed back attempt is not counted: the next claim has the same attempt number.
        await claimed(conn, "w2")
        await conn.execute(EXPIRED_LEASE)
        assert await parked(conn)
        assert (await requeue(conn, operation_id="op_1")).requeued
        # The requeue took generation 3 from any late holder; the next claim is generation 4.
        assert (await claimed(conn, "w3")).generation == 4
        assert await attempt_rows(conn) == [
            (1, 1, "w1", "HANDED_BACK", None, True),
            (2, 1, "w2", "LEASE_LOST", "WORKER_LOST", True),
            (4, 1, "w3", None, None, False),
        ]
