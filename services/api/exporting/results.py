"""Which stored file a download serves, and how it is named (docs/api.md: Downloads, Download; Export options)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC
from urllib.parse import quote

from services.api.http.problems import ProblemError, not_found
from shared.repository.artifacts import ArtifactFiles, StoredPart
from shared.repository.operation_view import OperationView

# Sent with every file: a browser that opens a downloaded HTML transcript (or is tricked into rendering any
# result) runs it in a sandbox with an opaque origin, never with the api's or the page's, and never guesses
# another type than the one sent.
DOWNLOAD_SAFETY = {"Content-Security-Policy": "sandbox", "X-Content-Type-Options": "nosniff"}

# What may stand in a quoted filename without escaping (RFC 6266 section 4.3 advises plain ASCII there).
_PLAIN_FILENAME = re.compile(r"[A-Za-z0-9._:-]+")


@dataclass(frozen=True)
class ResultFile:
    """One downloadable object of a SUCCEEDED operation: the file as the worker stored it (``stored``: its S3
    key, size and hex sha256), its media type, and the file name a browser should save it under.
    """

    operation_id: str
    stored: StoredPart
    content_type: str
    filename: str


def result_file(row: OperationView, part_number: str | None) -> ResultFile:
    """The file of ``row`` (a SUCCEEDED operation) that a download asks for: ``part_number`` (decimal text,
    1-based) of a split result, or the single file when None.

    Raises ``ProblemError`` RESULT_IN_PARTS (409) for the single file of a split result, NOT_FOUND for a part
    that does not exist (and any part of a result that is one file).
    """
    kind = row.request.file_kind
    stem = f"{row.conversation_id}-{row.created_at.astimezone(UTC):%Y-%m-%d}"
    files = _stored_files(row)
    if part_number is None:
        if files.single is None:
            raise ProblemError(
                "RESULT_IN_PARTS",
                "This result is split into parts; download each one from the operation's result.parts.",
            )
        return ResultFile(row.operation_id, files.single, kind.content_type, f"{stem}.{kind.extension}")
    parts = {str(part.number): part for part in files.parts} if files.split else {}
    part = parts.get(part_number)
    if part is None:
        raise not_found()
    return ResultFile(row.operation_id, part, kind.content_type, f"{stem}.part-{part_number}.{kind.extension}")


def _stored_files(row: OperationView) -> ArtifactFiles:
    # The write that made the operation SUCCEEDED set the key.
    assert row.result_key is not None
    return ArtifactFiles.from_record(
        key=row.result_key,
        # Only one file records its size here; a split result's parts record their own.
        size_bytes=row.result_size_bytes or 0,
        sha256=row.result_sha256,
        message_count=row.result_message_count or 0,
        parts=row.result_parts,
    )


def content_disposition(filename: str) -> str:
    """``attachment`` with ``filename`` (RFC 6266): quoted when it is plain ASCII, else an ASCII stand-in
    plus ``filename*`` in UTF-8 (RFC 8187).
    """
    if _PLAIN_FILENAME.fullmatch(filename):
        return f'attachment; filename="{filename}"'
    fallback = "".join(char if _PLAIN_FILENAME.fullmatch(char) else "_" for char in filename)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"
