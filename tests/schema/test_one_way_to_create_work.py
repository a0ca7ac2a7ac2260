"""One way to create work (docs/architecture.md: One way to create work): no Python code writes the first row of an
operation, an idempotency record or an outbox row itself; the database functions of migration 0020 do, for the
submit, a schedule's run and creation, and every other wake-up.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sorted(path for folder in ("shared", "services", "chatexport") for path in (ROOT / folder).rglob("*.py"))
WRITES = re.compile(r"INSERT\s+INTO\s+(operations|idempotency_keys|outbox)\b", re.IGNORECASE)


@pytest.mark.parametrize("path", PYTHON, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_python_code_creates_work_of_its_own(path: Path) -> None:
    assert WRITES.findall(path.read_text(encoding="utf-8")) == []
