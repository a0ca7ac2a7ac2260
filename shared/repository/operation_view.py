"""The typed row of the view ``operation_representations_v2`` (migrations 0025 and 0027): what the API and the
relay's callbacks read of an operation to show it (docs/api.md: Operations, Operation; Admin view of an operation).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any, Protocol

from shared.export.request import SHOWN_FIELDS, ExportRequest
from shared.recent import RecentlyUsed, built_for


class Stamped(Protocol):
    """What names one representation of an operation (``OperationView``, ``OperationStamp``): its id and
    creation time, its version and state, and its age (s), which sets ``next_poll_after_seconds``.
    """

    @property
    def operation_id(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def version(self) -> int: ...
    @property
    def age_seconds(self) -> float: ...


@dataclass(frozen=True, slots=True)
class OperationStamp:
    """The columns of the representation's view (``REPRESENTATION_VIEW``) that name one representation
    (``Stamped``): a poll reads these first and answers from the rendering its process keeps, reading the rest
    only when it keeps none (docs/benchmark.md: The poll's own work).
    """

    operation_id: str
    state: str
    created_at: datetime
    version: int
    age_seconds: float


@dataclass(frozen=True, slots=True)
class OperationView:
    """One row of the representation's view (``REPRESENTATION_VIEW``), its export request's columns gathered in
    ``request``.

    ``state`` is the text of a ``shared.states.State`` (a ``StrEnum``, so it compares equal to one) kept as
    text: the poll path reads it without building an enum member. Times are aware datetimes; ``age_seconds``
    is the database clock's seconds since ``created_at``; ``result_parts`` is the JSON text of a split
    result's parts (``repository.artifacts.ArtifactFiles.parts_json``), None for one file.
    """

    request: ExportRequest
    operation_id: str
    kind: str
    owner_id: str
    conversation_id: str
    state: str
    created_at: datetime
    updated_at: datetime
    attempt: int
    generation: int
    version: int
    age_seconds: float
    progress_phase: str | None
    messages_written: int
    bytes_written: int
    snapshot_max_seq: int | None
    retry_at: datetime | None
    error_code: str | None
    error_message: str | None
    result_key: str | None
    result_size_bytes: int | None
    result_sha256: str | None
    result_message_count: int | None
    result_expires_at: datetime | None
    result_parts: str | None
    finished_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    # A scheduled run's schedule and due time (docs/schedules.md: Runs); None for an export submitted by hand.
    schedule_id: str | None
    due_at: datetime | None
    # The bytes the worker expects to store, once it knows them (an export with media, before its first byte).
    estimate_bytes: int | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> OperationView:
        """Build from a row of the view (an ``asyncpg.Record`` or mapping); raises ``KeyError`` when a column
        is missing.
        """
        # Positional, in field order: the poll path builds one per answer (docs/benchmark.md: The poll's own work).
        columns: tuple[Any, ...] = _read_columns(row)
        # A request's columns are written once, by the submit: one operation's rows share one request.
        request = built_for(_requests, row["operation_id"], row["created_at"], lambda: ExportRequest.from_row(row))
        return cls(request, *columns)


# The view this release reads an operation's representation from. The previous release reads
# ``operation_representations`` (migration 0004) with ``*`` through prepared statements, so that one keeps its
# columns and each release that adds to the representation reads a view of its own (docs/deploy.md: Upgrading,
# What each mix of releases may do).
REPRESENTATION_VIEW = "operation_representations_v2"
# Every field but the first, ``request``, which ``ExportRequest.from_row`` reads from the request's columns.
_read_columns = itemgetter(*(field.name for field in dataclasses.fields(OperationView)[1:]))
# The view's columns ``OperationView.from_row`` reads, for a select list: named, never ``*``, so that a column a
# later release's pre migration adds to the view leaves the shape of this release's prepared statements as it
# was. Postgres refuses a prepared statement whose result changed shape, and asyncpg can prepare it again only
# outside a transaction (docs/deploy.md: Upgrading, What each mix of releases may do).
REPRESENTATION_COLUMNS: tuple[str, ...] = tuple(
    dict.fromkeys([*(field.name for field in dataclasses.fields(OperationView)[1:]), *SHOWN_FIELDS])
)
# The columns an ``OperationStamp`` is built from, by position: its fields, in their order.
STAMP_COLUMNS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(OperationStamp))


def select_list(columns: tuple[str, ...], prefix: str = "") -> str:
    """``columns`` (``REPRESENTATION_COLUMNS`` or ``STAMP_COLUMNS``) as a select list, each name after
    ``prefix`` (``"(accepted)."`` for a composite of the view's row type)."""
    return ", ".join(prefix + column for column in columns)


# How many operations a process keeps what it built of (their requests, their renderings): enough for every
# operation being polled or waited on at once.
OPERATIONS_KEPT = 4096
# operation_id -> its created_at (``built_for``'s stamp) and its request.
_requests: RecentlyUsed[str, tuple[datetime, ExportRequest]] = RecentlyUsed(OPERATIONS_KEPT)
