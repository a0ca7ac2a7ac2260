"""The bounded memo the api keeps of what it built (``shared.recent.RecentlyUsed``), and its use by the view of
an operation: one operation's reads share its request, another operation (or the same id in another database)
gets its own.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from shared.export.request import ExportRequest
from shared.recent import RecentlyUsed, built_for
from shared.repository.operation_view import OperationView


def test_the_least_recently_used_entry_leaves_first() -> None:
    memo: RecentlyUsed[str, int] = RecentlyUsed(2)
    memo.put("a", 1)
    memo.put("b", 2)
    assert memo.get("a") == 1  # "b" is now the least recently used
    memo.put("c", 3)
    assert (memo.get("a"), memo.get("b"), memo.get("c")) == (1, None, 3)
    assert len(memo) == 2


def test_a_write_replaces_and_forget_drops() -> None:
    memo: RecentlyUsed[str, int] = RecentlyUsed(2)
    memo.put("a", 1)
    memo.put("a", 2)
    assert memo.get("a") == 2 and len(memo) == 1
    memo.forget("a")
    memo.forget("never there")
    assert memo.get("a") is None and len(memo) == 0


def test_a_memo_holds_at_least_one_entry() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RecentlyUsed(0)


def _row(operation_id: str, created_at: datetime, **request: object) -> dict[str, object]:
    row: dict[str, object] = {field.name: None for field in dataclasses.fields(OperationView)[1:]}
    row.update({field.name: field.default for field in dataclasses.fields(ExportRequest)})
    row.update(operation_id=operation_id, created_at=created_at, version=1, **request)
    return row


def test_reads_of_one_operation_share_its_request() -> None:
    created = datetime(2026, 1, 1, tzinfo=UTC)
    first = OperationView.from_row(_row("op_shared", created, format="csv"))
    again = OperationView.from_row({**_row("op_shared", created, format="csv"), "version": 2})
    assert first.request == ExportRequest(format="csv")
    assert again.request is first.request and again.version == 2


def test_another_operation_or_database_reads_its_own_request() -> None:
    created = datetime(2026, 1, 1, tzinfo=UTC)
    kept = OperationView.from_row(_row("op_mine", created, format="csv"))
    other_id = OperationView.from_row(_row("op_other", created, format="jsonl"))
    # The same id created at another time: another database's operation.
    other_database = OperationView.from_row(_row("op_mine", created + timedelta(seconds=1), compression="gzip"))
    assert kept.request == ExportRequest(format="csv")
    assert other_id.request == ExportRequest(format="jsonl")
    assert other_database.request == ExportRequest(compression="gzip")


def test_a_stamped_value_is_built_once_per_stamp() -> None:
    memo: RecentlyUsed[str, tuple[int, str]] = RecentlyUsed(4)
    builds: list[str] = []

    def build(value: str) -> str:
        builds.append(value)
        return value

    assert built_for(memo, "op", 1, lambda: build("first")) == "first"
    assert built_for(memo, "op", 1, lambda: build("again")) == "first"
    # The same key at another stamp (the id in another database) is built anew, and replaces the first.
    assert built_for(memo, "op", 2, lambda: build("second")) == "second"
    assert built_for(memo, "op", 1, lambda: build("third")) == "third"
    assert builds == ["first", "second", "third"]
