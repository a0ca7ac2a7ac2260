"""The admin requeue, FAILED_REPAIR -> QUEUED (docs/api.md: Administration, Admin requeue; docs/states.md: States and
failure model, FAILED_REPAIR, for operators), over HTTP and from the command line.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import asyncpg

from shared.settings import Settings
from tests.support.api_calls import expect_problem
from tests.support.exports import GUESSED_ID, Auth, Client
from tests.support.rows import insert_operation

REPO = Path(__file__).resolve().parents[2]
PARKED = {"attempt": 5, "generation": 5, "error_code": "STORAGE_UNAVAILABLE", "error_message": "budget spent"}


async def parked(pool: asyncpg.Pool, operation_id: str = "op_1") -> None:
    await insert_operation(pool, operation_id, "FAILED_REPAIR", **PARKED)


async def wake_ups(pool: asyncpg.Pool, operation_id: str = "op_1") -> int:
    count: int = await pool.fetchval("SELECT count(*) FROM outbox WHERE operation_id = $1", operation_id)
    return count


async def test_requeue_puts_a_parked_operation_back_with_a_fresh_budget(
    api: Client, auth: Auth, pool: asyncpg.Pool
) -> None:
    await parked(pool)
    response = await api.post("/admin/operations/op_1/requeue", headers=auth("root", admin=True))
    assert response.status == 202
    assert await response.json() == {"operation_id": "op_1", "state": "QUEUED"}

    row = await pool.fetchrow("SELECT * FROM operations WHERE operation_id = 'op_1'")
    assert row is not None
    # A new generation: a worker still holding generation 5's lease is fenced out for good.
    assert (row["state"], row["attempt"], row["error_code"], row["generation"]) == ("QUEUED", 0, None, 6)
    assert await wake_ups(pool) == 1

    again = await api.post("/admin/operations/op_1/requeue", headers=auth("root", admin=True))
    body = await expect_problem(again, 409, "NOT_REQUEUEABLE")
    assert body["state"] == "QUEUED"
    assert await wake_ups(pool) == 1


async def test_a_requeued_operation_is_no_longer_done(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    # FAILED_REPAIR is parked, not final: its owner sees done until an operator requeues it (docs/api.md: Operations,
    # Operation).
    await parked(pool)
    before = await api.get("/v3/operations/op_1", headers=auth("alice"))
    assert (await before.json())["done"] is True
    await api.post("/admin/operations/op_1/requeue", headers=auth("root", admin=True))
    after = await api.get("/v3/operations/op_1", headers=auth("alice"))
    assert (await after.json())["done"] is False


async def test_requeue_refusals_change_nothing(api: Client, auth: Auth, pool: asyncpg.Pool) -> None:
    await parked(pool)
    await insert_operation(pool, "op_2", "SUCCEEDED")
    admin = auth("root", admin=True)
    await expect_problem(await api.post("/admin/operations/op_1/requeue", headers=auth("alice")), 403, "FORBIDDEN")
    await expect_problem(await api.post("/admin/operations/op_1/requeue"), 401, "UNAUTHENTICATED")
    await expect_problem(await api.post(f"/admin/operations/{GUESSED_ID}/requeue", headers=admin), 404, "NOT_FOUND")
    await expect_problem(await api.post("/admin/operations/op%00/requeue", headers=admin), 422, "VALIDATION_FAILED")
    junk = {**admin, "Content-Type": "text/plain"}
    await expect_problem(
        await api.post("/admin/operations/op_1/requeue", data="x", headers=junk), 415, "UNSUPPORTED_MEDIA_TYPE"
    )
    await expect_problem(
        await api.post("/admin/operations/op_1/requeue", json={"force": True}, headers=admin), 422, "VALIDATION_FAILED"
    )
    refused = await expect_problem(
        await api.post("/admin/operations/op_2/requeue", headers=admin), 409, "NOT_REQUEUEABLE"
    )
    assert refused["state"] == "SUCCEEDED"
    states = await pool.fetch("SELECT operation_id, state FROM operations ORDER BY operation_id")
    assert [tuple(row) for row in states] == [("op_1", "FAILED_REPAIR"), ("op_2", "SUCCEEDED")]
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 0


async def test_the_requeue_command_requeues_and_reports_what_it_left(pool: asyncpg.Pool, settings: Settings) -> None:
    await parked(pool, "op_1")
    await insert_operation(pool, "op_2", "RUNNING")
    env = {**os.environ, "CHATEXPORT_DATABASE_URL": settings.database_url}
    command = [sys.executable, "-m", "chatexport.cli", "requeue", "op_1", "op_2", GUESSED_ID]
    process = await asyncio.create_subprocess_exec(
        *command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)

    assert process.returncode == 1
    assert out.decode() == "op_1: requeued\n"
    assert "op_2: not requeued (RUNNING)" in err.decode()
    assert f"{GUESSED_ID}: not requeued (no such operation)" in err.decode()
    assert await pool.fetchval("SELECT state FROM operations WHERE operation_id = 'op_1'") == "QUEUED"
    assert await pool.fetchval("SELECT state FROM operations WHERE operation_id = 'op_2'") == "RUNNING"
    assert await wake_ups(pool, "op_1") == 1
