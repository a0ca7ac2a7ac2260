"""What an export with media puts in its ZIP (docs/api.md: Submitting an export, Exports with media):
which attachments go in and why the others stay out, where each goes (``media/<attachment id>/<safe name>``),
and how a message shows its attachments then.

The decisions are made once, before the first byte, from the attachments the export's messages carry in the
order the file first shows them, so every attempt makes the same ones; only ``unavailable`` is found on the
way, when the bucket no longer holds a file, and the ZIP writes the media before the messages' file.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

from shared import jsontext
from shared.export.message_shape import message_json

# Why an attachment is not in the ZIP.
TOO_LARGE: Final = "too_large"
TYPE_EXCLUDED: Final = "type_excluded"
UNAVAILABLE: Final = "unavailable"
LEFT_OUT_REASONS: Final = (TOO_LARGE, TYPE_EXCLUDED, UNAVAILABLE)

MEDIA_FOLDER: Final = "media"
MANIFEST_NAME: Final = "manifest.json"
# A name made safe keeps at most this many UTF-8 bytes (most file systems allow 255 per name).
MAX_SAFE_NAME_BYTES = 200
_FALLBACK_NAME = "file"
# What never stays in a member's name: path separators (of every system, and the yen and won signs that
# Windows' East Asian code pages turn into one), what Windows refuses in a name, and every character of Unicode
# category C (controls, format characters such as the bidirectional overrides, surrogates, private use,
# unassigned). Names are NFKC-folded first, so a full-width solidus or full stop is caught as itself.
_REFUSED = re.compile(r'[/\\<>:"|?*\u00a5\u20a9]')
# Device names Windows will not create a file under, whatever the extension (``nul.png``).
_WINDOWS_DEVICES = frozenset(
    {"CON", "PRN", "AUX", "NUL", *(f"{port}{n}" for port in ("COM", "LPT") for n in range(1, 10))}
)


def left_out_entries(plan: MediaPlan, carried: Iterable[Carried]) -> list[dict[str, Any]]:
    """The manifest's ``left_out``: each of ``carried`` (in order) that ``plan`` leaves out, with its name, size and
    why."""
    return [
        {
            "attachment_id": attachment.attachment_id,
            "file_name": attachment.file_name,
            "size_bytes": attachment.size_bytes,
            "reason": plan.left_out[attachment.attachment_id],
        }
        for attachment in carried
        if attachment.attachment_id in plan.left_out
    ]


class Carried(Protocol):
    """An attachment the export's messages carry (``shared.repository.export_reader.CarriedAttachment``)."""

    @property
    def attachment_id(self) -> str: ...

    @property
    def file_name(self) -> str: ...

    @property
    def content_type(self) -> str: ...

    @property
    def size_bytes(self) -> int: ...


def safe_name(file_name: str) -> str:
    """``file_name`` as a ZIP member's last path component: NFKC-folded, then every path separator, character
    Windows refuses in a name and character of Unicode category C (NUL and the other controls, the bidirectional
    controls) becomes ``_``; trailing dots and spaces (which Windows drops) go; a name of dots and spaces only
    (``..``) becomes ``file``; a Windows device name (``CON``, ``nul.png``) gets a leading ``_``; cut to
    ``MAX_SAFE_NAME_BYTES`` of UTF-8 keeping its extension. What remains can never leave the attachment's folder.
    """
    folded = unicodedata.normalize("NFKC", file_name)
    cleaned = "".join(
        "_" if _REFUSED.match(char) or unicodedata.category(char).startswith("C") else char for char in folded
    ).rstrip(". ")
    if not cleaned.strip(". "):
        return _FALLBACK_NAME
    if cleaned.split(".", 1)[0].rstrip(" ").upper() in _WINDOWS_DEVICES:
        cleaned = f"_{cleaned}"
    if len(cleaned.encode()) <= MAX_SAFE_NAME_BYTES:
        return cleaned
    stem, dot, extension = cleaned.rpartition(".")
    keep = f"{dot}{extension}" if dot and len(extension.encode()) <= 16 else ""
    stem = stem if keep else cleaned
    while len((stem + keep).encode()) > MAX_SAFE_NAME_BYTES:
        stem = stem[:-1]
    return stem + keep


def member_path(attachment_id: str, file_name: str) -> str:
    """The ZIP member of an attachment: ``media/<attachment id>/<safe name>``. The id is the store's own
    (``shared.ids.new_attachment_id``: URL-safe), so two files never share a folder."""
    return f"{MEDIA_FOLDER}/{attachment_id}/{safe_name(file_name)}"


def type_matches(content_type: str, patterns: Iterable[str]) -> bool:
    """True when ``content_type`` is one of ``patterns`` (``image/png``) or of one's type (``image/*``),
    compared without regard to case."""
    kind = content_type.lower()
    major = kind.split("/", 1)[0]
    return any(pattern == kind or pattern == f"{major}/*" for pattern in (p.lower() for p in patterns))


@dataclass
class MediaPlan:
    """The attachments of one export: ``included`` (id -> member path, in the order they go in the ZIP) and
    ``left_out`` (id -> one of ``LEFT_OUT_REASONS``); ``included_bytes``, the files' bytes it plans to store.
    """

    included: dict[str, str] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    included_bytes: int = 0

    def mark_unavailable(self, attachment_id: str, size_bytes: int) -> None:
        """The bucket no longer holds the file: it stays out as ``unavailable``."""
        del self.included[attachment_id]
        self.included_bytes -= size_bytes
        self.left_out[attachment_id] = UNAVAILABLE

    def shown(self, attachments_json: str) -> str:
        """A message's ``attachments`` (their JSON text) as the ZIP's file shows them: each with ``path``, its
        member, or ``left_out``, why it is not in the ZIP; written as the file writes JSON."""
        items = json.loads(attachments_json)
        for item in items:
            attachment_id = item["attachment_id"]
            if attachment_id in self.included:
                item["path"] = self.included[attachment_id]
            else:
                item["left_out"] = self.left_out[attachment_id]
        return jsontext.dumps(items, separators=(",", ":"))


def plan_media(
    carried: Iterable[Carried],
    *,
    types: Iterable[str] | None,
    max_file_bytes: int | None,
    max_total_bytes: int | None,
) -> MediaPlan:
    """Decide, in the order of ``carried``, which attachments go in: those of the ``types`` (every type when
    None), each at most ``max_file_bytes``, while the files taken so far and it stay within ``max_total_bytes``
    (a file that would pass it stays out, and a smaller one after it may still go in). The others are
    ``type_excluded`` or ``too_large``.
    """
    plan = MediaPlan()
    patterns = None if types is None else tuple(types)
    for attachment in carried:
        if patterns is not None and not type_matches(attachment.content_type, patterns):
            plan.left_out[attachment.attachment_id] = TYPE_EXCLUDED
        elif (max_file_bytes is not None and attachment.size_bytes > max_file_bytes) or (
            max_total_bytes is not None and plan.included_bytes + attachment.size_bytes > max_total_bytes
        ):
            plan.left_out[attachment.attachment_id] = TOO_LARGE
        else:
            plan.included[attachment.attachment_id] = member_path(attachment.attachment_id, attachment.file_name)
            plan.included_bytes += attachment.size_bytes
    return plan


def with_media(row: Any, plan: MediaPlan, conversation_id: str) -> Any:
    """``row`` (an ``ExportRow``) as a ZIP's file shows it: its attachments as ``MediaPlan.shown`` gives them and
    its JSONL line rendered again to match; a message without attachments is returned as it is."""
    if row.attachments is None:
        return row
    shown = replace(row, attachments=plan.shown(row.attachments))
    values: Mapping[str, Any] = {"conversation_id": conversation_id, **vars(shown)}
    return replace(shown, line=jsontext.dumps(message_json(values), separators=(",", ":")))
