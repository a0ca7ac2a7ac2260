"""The export request (docs/api.md: Submitting an export, Submit; Export options): the one list of its fields. The body
a client submits names the same fields (``notify`` holding ``notify_url``), the ``operations`` table stores
each in the column of its name, and the server-side submit takes the request as one JSON object of them
(migration 0009). A new field goes here, into the submission's schema, into a new column and into a new
version of that function (docs/deploy.md: Rolling deploys).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.export.formats import DEFAULT_COMPRESSION, DEFAULT_FORMAT, FileKind
from shared.timefmt import format_timestamp


@dataclass(frozen=True)
class ExportRequest:
    """An export request after defaults: ``{}`` equals ``{"format": "jsonl", "after_seq": 0, "compression":
    "none"}``. ``since`` and ``until`` are aware datetimes (UTC, milliseconds, as ``shared.timefmt`` parses
    them); ``senders`` is sorted and without repeats, or None for every sender; ``max_part_bytes`` is None
    for one file.
    """

    format: str = DEFAULT_FORMAT
    before_seq: int | None = None
    after_seq: int = 0
    # Where the completion callback goes, if anywhere (docs/api.md: Completion callbacks).
    notify_url: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    senders: tuple[str, ...] | None = None
    compression: str = DEFAULT_COMPRESSION
    max_part_bytes: int | None = None
    # A ZIP holding the file and the attachments its messages carry (docs/api.md: Submitting an export, Exports
    # with media): only those whose type ``media_types`` matches (``image/*`` or ``image/png``;
    # None: every type), each at most ``media_max_file_bytes`` and all at most ``media_max_total_bytes``.
    media: bool = False
    media_types: tuple[str, ...] | None = None
    media_max_file_bytes: int | None = None
    media_max_total_bytes: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ExportRequest:
        """The request stored in an ``operations`` row: its columns named as the fields. ``notify_url`` may be
        left out of ``row`` (only the callbacks read it); raises ``KeyError`` when another field's is.
        """
        values = {name: row[name] for name in SHOWN_FIELDS}
        for listed in ("senders", "media_types"):
            values[listed] = None if values[listed] is None else tuple(values[listed])
        # NULL: a request stored by a release before media existed, or a schedule's that never names it.
        values["media"] = bool(values["media"])
        return cls(**values, notify_url=row.get("notify_url"))

    @property
    def selects_messages(self) -> bool:
        """True when an option (``since``, ``until``, ``senders``) leaves out some messages of the seq range."""
        return self.since is not None or self.until is not None or self.senders is not None

    @property
    def file_kind(self) -> FileKind:
        """The format and compression of the file, and whether it is packed in a ZIP with media."""
        return FileKind(self.format, self.compression, zipped=self.media)

    def options(self) -> dict[str, Any]:
        """The request as the operation shows it (docs/api.md: Operations, Operation): every field but the
        callback's URL, defaults included, times as API timestamps, ``senders`` a list.
        """
        return {name: _shown(getattr(self, name)) for name in SHOWN_FIELDS}

    def as_json(self) -> str:
        """Every field as one JSON object, times in ISO 8601 with their offset: the argument of the
        server-side submit, which stores each member in the ``operations`` column of its name.
        """
        return json.dumps({name: getattr(self, name) for name in FIELDS}, default=datetime.isoformat)


def _shown(value: object) -> object:
    if isinstance(value, datetime):
        return format_timestamp(value)
    if isinstance(value, tuple):
        return list(value)
    return value


# The request's field names, in order: also its columns in ``operations``.
FIELDS = tuple(field.name for field in dataclasses.fields(ExportRequest))
# What the operation shows of it: the callback's URL stays with its owner (docs/api.md:
# Completion callbacks).
SHOWN_FIELDS = tuple(name for name in FIELDS if name != "notify_url")
# The options a schedule refuses: every run after the first would be empty (docs/schedules.md: The resource).
SCHEDULE_REFUSED_OPTIONS = ("before_seq", "until")
# The options of a submit alone, which a schedule neither takes nor shows (docs/api.md: Submitting an export,
# Exports with media).
SUBMIT_ONLY_OPTIONS = ("media", "media_types", "media_max_file_bytes", "media_max_total_bytes")
