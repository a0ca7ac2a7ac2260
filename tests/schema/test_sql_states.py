"""States in SQL are those of ``shared.states`` (docs/states.md: States and failure model): every state the
repository's statements and the migrations name is a member of an enumeration there, and no repository
statement lists a set of states of its own: sets are passed from ``shared.states``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.worker.metrics import ATTEMPT_OUTCOMES
from shared.states import ArtifactState, AttachmentState, ChunkState, PauseReason, ScheduleState, State, WaitingReason

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = sorted((ROOT / "shared" / "repository").glob("*.py"))
MIGRATIONS = sorted((ROOT / "shared" / "migrations").glob("*.sql"))
# Upper-case SQL literals that name no state: the error code of an operation parked after its workers were lost.
NOT_STATES = {"WORKER_LOST"}
KNOWN = {
    *State,
    *ArtifactState,
    *AttachmentState,
    *ChunkState,
    *ScheduleState,
    *PauseReason,
    *WaitingReason,
    *ATTEMPT_OUTCOMES,
    *NOT_STATES,
}
LITERAL = re.compile(r"'([A-Z][A-Z_]*)'")
# A list of literals after IN: a set of states written in the statement.
LISTED_SET = re.compile(r"\bIN\s*\(\s*'[A-Z][A-Z_]*'\s*,", re.IGNORECASE)


@pytest.mark.parametrize("path", REPOSITORY + MIGRATIONS, ids=lambda path: path.name)
def test_every_state_sql_names_is_a_state(path: Path) -> None:
    assert set(LITERAL.findall(path.read_text(encoding="utf-8"))) <= KNOWN


@pytest.mark.parametrize("path", REPOSITORY, ids=lambda path: path.name)
def test_repository_statements_take_sets_of_states_from_the_states_module(path: Path) -> None:
    assert not LISTED_SET.search(path.read_text(encoding="utf-8"))


def test_the_patterns_find_a_misspelt_state_and_a_listed_set() -> None:
    statement = "UPDATE operations SET state = 'CANCELLED' WHERE state IN ('QUEUED', 'RUNNING')"
    assert set(LITERAL.findall(statement)) - KNOWN == {"CANCELLED"}
    assert LISTED_SET.search(statement)
