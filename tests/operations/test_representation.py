"""The operation's representation and its response model are one shape (docs/api.md: Operations, Operation): in
every state, ``represent`` of a real row of the view validates against ``schemas.Operation`` (which forbids a
member it does not declare), the model declares no member that no representation shows, and ``done`` is true
exactly in the terminal states.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any, get_args

import asyncpg
import pytest
from pydantic import BaseModel

from services.api.http.responses import rendered_operation
from services.api.http.schemas import Operation
from shared.repository import status_monitor
from shared.representation import represent
from shared.states import TERMINAL, State
from tests.support.rows import insert_operation

pytestmark = pytest.mark.module_database

WHEN = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
ERROR = {"error_code": "STORAGE_UNAVAILABLE", "error_message": "storage did not answer"}
RESULT = {
    "result_key": "exports/op/g1.jsonl",
    "result_size_bytes": 612,
    "result_sha256": "0" * 64,
    "result_message_count": 5,
    "result_expires_at": WHEN,
    "finished_at": WHEN,
    "snapshot_max_seq": 8,
}
PART = {"key": "exports/op/g1.part-1.csv", "size_bytes": 612, "sha256": "0" * 64, "message_count": 5}
# Every option given, so that each member of ``request`` is shown with a value.
OPTIONS = {
    "format": "csv",
    "before_seq": 9,
    "since": WHEN,
    "until": WHEN.replace(hour=13),
    "senders": ["alice", "bob"],
    "compression": "gzip",
    "max_part_bytes": 5 * 1024 * 1024,
}
RUNNING = {"attempt": 1, "generation": 1, "progress_phase": "writing", "messages_written": 5, "snapshot_max_seq": 8}
# (state, columns) of every state, a result in one file and in parts.
CASES: dict[str, tuple[State, dict[str, Any]]] = {
    "queued": (State.QUEUED, {}),
    "running": (State.RUNNING, RUNNING),
    "retry_at": (State.RETRY_AT, {**RUNNING, **ERROR, "retry_at": WHEN}),
    "cancel_requested": (State.CANCEL_REQUESTED, RUNNING),
    "succeeded": (State.SUCCEEDED, RESULT),
    "succeeded_in_parts": (
        State.SUCCEEDED,
        {
            **OPTIONS,
            **RESULT,
            "result_parts": json.dumps([{**PART, "number": 1, "first_seq": 1, "last_seq": 5}]),
        },
    ),
    "canceled": (State.CANCELED, {}),
    "failed": (State.FAILED, {**ERROR, "error_code": "ACCESS_REVOKED"}),
    "failed_repair": (State.FAILED_REPAIR, ERROR),
    "expired": (State.EXPIRED, {**RESULT, "result_key": None}),
}


async def represented(pool: asyncpg.Pool, case: str) -> dict[str, Any]:
    """``represent`` of the view's row of an operation stored as ``CASES[case]`` says."""
    state, columns = CASES[case]
    await insert_operation(pool, f"op_{case}", state, **columns)
    async with pool.acquire() as conn:
        row = await status_monitor.read_operation(conn, operation_id=f"op_{case}", owner_id=None)
    assert row is not None
    return represent(row)


def shown_members(node: Any, prefix: str = "") -> set[str]:
    """The dotted paths of every object member in ``node``; a list's items share the list's path."""
    if isinstance(node, list):
        return set().union(*(shown_members(item, prefix) for item in node))
    if not isinstance(node, dict):
        return set()
    return {f"{prefix}{key}" for key in node} | set().union(
        *(shown_members(value, f"{prefix}{key}.") for key, value in node.items())
    )


def declared_members(model: type[BaseModel], prefix: str = "") -> set[str]:
    """The dotted paths of every member ``model`` declares, under its JSON names, nested models included."""
    members = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}{field.alias or name}"
        members.add(path)
        for nested in _models_in(field.annotation):
            members |= declared_members(nested, f"{path}.")
    return members


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in get_args(annotation) for model in _models_in(argument)]


@pytest.mark.parametrize("case", CASES)
async def test_every_state_is_represented_as_the_model_declares(pool: asyncpg.Pool, case: str) -> None:
    body = await represented(pool, case)
    Operation.model_validate(body)
    assert body["done"] is (State(body["state"]) in TERMINAL)


async def test_the_model_declares_nothing_that_no_representation_shows(pool: asyncpg.Pool) -> None:
    shown = set().union(*[shown_members(await represented(pool, case)) for case in CASES])
    assert declared_members(Operation) == shown


async def test_a_version_is_rendered_once_and_each_change_anew(pool: asyncpg.Pool) -> None:
    """Polls of one version and waiters woken together share one JSON text; a change is rendered anew, and so is
    the same version once its ``next_poll_after_seconds`` has grown."""
    await insert_operation(pool, "op_running", State.RUNNING)
    async with pool.acquire() as conn:
        row = await status_monitor.read_operation(conn, operation_id="op_running", owner_id=None)
        again = await status_monitor.read_operation(conn, operation_id="op_running", owner_id=None)
        assert row is not None and again is not None and again is not row
        text = rendered_operation(row)
        assert json.loads(text) == represent(row)
        assert rendered_operation(again) is text
        older = dataclasses.replace(row, age_seconds=row.age_seconds + 3600)
        assert json.loads(rendered_operation(older)) == represent(older) != represent(row)
        await conn.execute("UPDATE operations SET state = 'SUCCEEDED' WHERE operation_id = 'op_running'")
        later = await status_monitor.read_operation(conn, operation_id="op_running", owner_id=None)
    assert later is not None and later.version != row.version
    assert json.loads(rendered_operation(later))["state"] == "SUCCEEDED"
    assert rendered_operation(row) is text


async def test_operations_of_one_id_and_version_in_two_databases_are_rendered_apart(pool: asyncpg.Pool) -> None:
    await insert_operation(pool, "op_running", State.RUNNING)
    async with pool.acquire() as conn:
        row = await status_monitor.read_operation(conn, operation_id="op_running", owner_id=None)
    assert row is not None
    # The same id and version in another database: created at another time, in another state.
    elsewhere = dataclasses.replace(row, created_at=datetime(2020, 1, 1, tzinfo=UTC), state=State.QUEUED)
    assert json.loads(rendered_operation(row))["state"] == "RUNNING"
    assert json.loads(rendered_operation(elsewhere))["state"] == "QUEUED"
