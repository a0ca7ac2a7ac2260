"""The canonical export request and its fingerprint (README: API reference, Submit)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ExportRequest:
    """An export request after defaults: ``{"format":"jsonl"}`` equals ``{..., "after_seq": 0}``."""

    format: str
    before_seq: int | None
    after_seq: int
    # Where the completion callback goes, if anywhere (README: API reference, Completion callbacks).
    notify_url: str | None = None


def fingerprint(*, user_id: str, conversation_id: str, request: ExportRequest) -> str:
    """Hex sha256 of the canonical request ``(user, cid, format, before_seq, after_seq[, notify])``.

    Two submissions are "the same request" for idempotency exactly when their fingerprints are equal. An
    absent ``notify`` leaves the canonical form as it was before callbacks existed, so keys stored then
    still replay.
    """
    fields = asdict(request)
    notify_url = fields.pop("notify_url")
    canonical = {"user": user_id, "conversation_id": conversation_id, **fields}
    if notify_url is not None:
        canonical["notify"] = {"url": notify_url}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()
