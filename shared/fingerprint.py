"""The canonical export request and its fingerprint (README: API reference, Submit; Export options)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.formats import DEFAULT_COMPRESSION, DEFAULT_FORMAT, FileKind
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
    # Where the completion callback goes, if anywhere (README: API reference, Completion callbacks).
    notify_url: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    senders: tuple[str, ...] | None = None
    compression: str = DEFAULT_COMPRESSION
    max_part_bytes: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ExportRequest:
        """The request stored in an ``operations`` row (its columns of the same names; ``notify_url``
        optional).
        """
        senders = row["senders"]
        return cls(
            format=row["format"],
            before_seq=row["before_seq"],
            after_seq=row["after_seq"],
            notify_url=row.get("notify_url"),
            since=row["since"],
            until=row["until"],
            senders=None if senders is None else tuple(senders),
            compression=row["compression"],
            max_part_bytes=row["max_part_bytes"],
        )

    @property
    def selects_messages(self) -> bool:
        """True when an option (``since``, ``until``, ``senders``) leaves out some messages of the seq range."""
        return self.since is not None or self.until is not None or self.senders is not None

    @property
    def file_kind(self) -> FileKind:
        """The format and compression of the file."""
        return FileKind(self.format, self.compression)

    def options(self) -> dict[str, Any]:
        """The request as the operation shows it (README: API reference, Operation): every option, defaults
        included, times as API timestamps; the callback's URL is not shown.
        """
        return {
            "format": self.format,
            "before_seq": self.before_seq,
            "after_seq": self.after_seq,
            "since": format_timestamp(self.since),
            "until": format_timestamp(self.until),
            "senders": None if self.senders is None else list(self.senders),
            "compression": self.compression,
            "max_part_bytes": self.max_part_bytes,
        }


def fingerprint(*, user_id: str, conversation_id: str, request: ExportRequest) -> str:
    """Hex sha256 of the canonical request ``(user, cid, format, before_seq, after_seq[, options][, notify])``.

    Two submissions are "the same request" for idempotency exactly when their fingerprints are equal. An
    option at its default (``since``, ``until``, ``senders``, ``max_part_bytes`` absent, ``compression``
    none) and an absent ``notify`` leave the canonical form as it was before they existed, so keys stored
    then still replay; times enter as UTC instants, so equal instants in other offsets are the same request.
    """
    options = request.options()
    canonical = {
        "user": user_id,
        "conversation_id": conversation_id,
        **{name: options.pop(name) for name in ("format", "before_seq", "after_seq")},
    }
    canonical.update((name, value) for name, value in options.items() if value not in (None, DEFAULT_COMPRESSION))
    if request.notify_url is not None:
        canonical["notify"] = {"url": request.notify_url}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()
