"""The canonical export request's fingerprint (docs/api.md: Submitting an export, Submit; Export options)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from shared.export.formats import DEFAULT_COMPRESSION
from shared.export.request import ExportRequest
from shared.timefmt import format_timestamp


def fingerprint(*, user_id: str, conversation_id: str, request: ExportRequest) -> str:
    """Hex sha256 of the canonical request ``(user, cid, format, before_seq, after_seq[, options][, notify])``.

    Two submissions are "the same request" for idempotency exactly when their fingerprints are equal. An
    option at its default (``since``, ``until``, ``senders``, ``max_part_bytes`` and the media limits absent,
    ``compression`` none, ``media`` false) and an absent ``notify`` leave the canonical form as it was before
    they existed, so keys stored then still replay; times enter as UTC instants, so equal instants in other
    offsets are the same request.
    """
    options = request.options()
    canonical = {
        "user": user_id,
        "conversation_id": conversation_id,
        **{name: options.pop(name) for name in ("format", "before_seq", "after_seq")},
    }
    canonical.update(
        (name, value)
        for name, value in options.items()
        if value is not None and value is not False and value != DEFAULT_COMPRESSION
    )
    if request.notify_url is not None:
        canonical["notify"] = {"url": request.notify_url}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def schedule_fingerprint(
    *, user_id: str, conversation_id: str, request: ExportRequest, every: str, start_at: datetime | None, mode: str
) -> str:
    """Hex sha256 of a schedule's canonical body (docs/schedules.md: The resource): its runs' request as
    ``fingerprint`` reads it, the interval as normalised (``shared.export.cadence.Cadence.text``), the anchor as a UTC
    instant (None when left to the creation) and the mode. Never equal to an export's fingerprint: submits and
    schedules share one key space, and a key used for one is reused by the other.
    """
    canonical = {
        "kind": "schedule",
        "request": fingerprint(user_id=user_id, conversation_id=conversation_id, request=request),
        "every": every,
        "start_at": None if start_at is None else format_timestamp(start_at),
        "mode": mode,
    }
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()
