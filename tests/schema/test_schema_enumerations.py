"""The enumerations the database knows are those of the code: in a migrated database, the CHECK constraints
list exactly the states of ``shared.states`` and the formats and compressions of ``shared.export.formats``, the sets
of states in index predicates and triggers are the sets ``shared.states`` names, and every state a function
names is a state (docs/states.md: States and failure model; docs/api.md: Submitting an export, Export options).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable

import asyncpg
import pytest

from services.worker.metrics import ATTEMPT_OUTCOMES
from shared.export.formats import COMPRESSIONS, FORMAT_NAMES
from shared.states import (
    ACTIVE,
    ENDED,
    ArtifactState,
    ChunkState,
    PauseReason,
    ScheduleMode,
    ScheduleState,
    State,
    WaitingReason,
)
from tests.schema.test_sql_states import KNOWN

pytestmark = pytest.mark.integration  # the real Postgres, reached without the database fixtures

_CHECK_OF_COLUMN = """
SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
WHERE c.contype = 'c' AND c.conrelid = $1::regclass AND a.attname = $2 AND cardinality(c.conkey) = 1
"""
_TEXT_LITERAL = re.compile(r"'([^']*)'::text")


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    yield connection
    await connection.close()


async def allowed_values(conn: asyncpg.Connection, table: str, column: str) -> set[str]:
    """The text values the one CHECK constraint of ``table.column`` alone admits."""
    definitions = [row[0] for row in await conn.fetch(_CHECK_OF_COLUMN, table, column)]
    assert len(definitions) == 1, definitions
    return set(_TEXT_LITERAL.findall(definitions[0]))


@pytest.mark.parametrize(("column", "values"), [("format", FORMAT_NAMES), ("compression", COMPRESSIONS)])
async def test_the_operation_request_columns_admit_exactly_the_registry(
    conn: asyncpg.Connection, column: str, values: tuple[str, ...]
) -> None:
    assert await allowed_values(conn, "operations", column) == set(values)


@pytest.mark.parametrize(
    ("table", "column", "values"),
    [
        ("operations", "state", State),
        ("artifacts", "state", ArtifactState),
        ("export_chunks", "state", ChunkState),
        ("attempts", "outcome", ATTEMPT_OUTCOMES),
        ("export_schedules", "state", ScheduleState),
        ("export_schedules", "paused_reason", PauseReason),
        ("export_schedules", "waiting_reason", WaitingReason),
        ("export_schedules", "mode", ScheduleMode),
    ],
)
async def test_the_state_columns_admit_exactly_the_enumerations(
    conn: asyncpg.Connection, table: str, column: str, values: Iterable[str]
) -> None:
    assert await allowed_values(conn, table, column) == set(values)


async def test_the_sets_of_states_in_an_index_and_a_trigger_are_those_of_the_states_module(
    conn: asyncpg.Connection,
) -> None:
    predicate = await conn.fetchval(
        "SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indexrelid = 'operations_active'::regclass"
    )
    # The operations the janitor's and the gauges' scans look for: not ended for good.
    assert set(_TEXT_LITERAL.findall(predicate)) == ACTIVE | {State.FAILED_REPAIR}
    trigger = await conn.fetchval(
        "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = 'operation_ended_notify'"
    )
    assert set(_TEXT_LITERAL.findall(trigger)) == ENDED


async def test_every_state_a_function_names_is_a_state(conn: asyncpg.Connection) -> None:
    bodies = await conn.fetch(
        "SELECT p.proname, pg_get_functiondef(p.oid) AS body FROM pg_proc p"
        " WHERE p.pronamespace = 'public'::regnamespace AND p.prokind = 'f'"
    )
    named = {row["proname"]: set(re.findall(r"'([A-Z][A-Z_]*)'", row["body"])) for row in bodies}
    assert named["operation_is_runnable"] == {State.QUEUED, State.RETRY_AT, State.RUNNING}
    # A schedule's states and pause reasons, in what a run's end does to its schedule (migration 0013); an
    # artifact's states and an attempt's outcomes, in the claim and the SUCCEEDED commit (migration 0017).
    assert set().union(*named.values()) <= KNOWN
