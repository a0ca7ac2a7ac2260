"""Progress phases are one enumeration (docs/api.md: Operations, Operation): the phases the repository and
the migrations' functions write in SQL, the ones the API reference lists and the API's schema all name members
of ``shared.export.phases.Phase``.
"""

from __future__ import annotations

import re
from pathlib import Path

from services.api.http.schemas import Progress
from shared.export.phases import Phase
from shared.states import State

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY_SQL = "".join(path.read_text(encoding="utf-8") for path in (ROOT / "shared" / "repository").glob("*.py"))
MIGRATIONS_SQL = "".join(path.read_text(encoding="utf-8") for path in (ROOT / "shared" / "migrations").glob("*.sql"))
API_PAGE = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")


def test_every_phase_the_repository_writes_is_a_phase() -> None:
    written = set(re.findall(r"progress_phase = '([^']*)'", REPOSITORY_SQL + MIGRATIONS_SQL))
    assert written, "the pattern no longer finds the phases written in SQL"
    assert written <= set(Phase)


def test_an_attempt_that_ends_with_an_error_shows_its_state_as_a_phase() -> None:
    # end_attempt writes lower(state) as the phase of the states a worker's error leads to.
    assert "progress_phase = lower($3)" in REPOSITORY_SQL
    for state in (State.RETRY_AT, State.FAILED, State.FAILED_REPAIR):
        assert Phase(state.lower())


def test_the_readme_and_the_schema_list_every_phase() -> None:
    sentence = API_PAGE[API_PAGE.index("`progress.phase` is one of") :]
    sentence = sentence[: sentence.index(";")]
    assert re.findall(r"`([^`]+)`", sentence)[1:] == list(Phase)
    description = Progress.model_fields["phase"].description
    assert description is not None
    assert all(phase in description for phase in Phase)
