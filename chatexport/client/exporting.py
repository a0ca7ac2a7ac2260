"""``chatexport export``: submit, wait, download and verify, resumable at every step (docs/command-line.md: Command-line
client).

The Idempotency-Key is stored in ``FILE.part.json`` before the first submit, so running the same command
again after Ctrl-C, a crash or a lost 202 submits with the same key and so follows the same operation
instead of starting another. The state file goes once the export has ended: verified in place (appended,
for an incremental export), or failed.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatexport.client import incremental
from chatexport.client.api import Api, ApiError
from chatexport.client.download import Downloaded, download_result, fetch_verified
from chatexport.client.progress import ProgressDisplay
from chatexport.client.statefiles import UnusableStateFile, read_state, write_state
from chatexport.client.waiting import until_terminal


@dataclass(frozen=True)
class ExportState:
    """What a run remembers beside its output: the key it submits with, and what it asked for."""

    idempotency_key: str
    conversation_id: str
    request: dict[str, Any]


@dataclass(frozen=True)
class ExportOutcome:
    """How an export run ended: the operation's last representation, and the files written (in order) when
    it SUCCEEDED; for an incremental export, OUTPUT with the figures of what was appended to it.
    """

    operation: dict[str, Any]
    written: list[Downloaded] | None


def state_path(output: Path) -> Path:
    """The state file of an export into ``output``."""
    return output.with_name(output.name + ".part.json")


async def export(
    api: Api, *, conversation_id: str, request: dict[str, Any], output: Path, progress: ProgressDisplay
) -> ExportOutcome:
    """Export ``conversation_id`` with ``request`` (the submit body) into ``output``, or beside it for a split
    result (``download_result``). Raises ``ApiError``, ``aiohttp.ClientError``, ``NotVerified``,
    ``UnusableStateFile`` and ``OSError`` for the local files.
    """
    operation = await _until_ended(
        api, conversation_id=conversation_id, request=request, output=output, progress=progress
    )
    if operation["state"] != "SUCCEEDED":
        return ExportOutcome(operation, None)
    written = await download_result(api, operation, output)
    state_path(output).unlink(missing_ok=True)
    return ExportOutcome(operation, written)


async def export_incrementally(
    api: Api, *, conversation_id: str, request: dict[str, Any], output: Path, progress: ProgressDisplay
) -> ExportOutcome:
    """Export what is new in ``conversation_id`` since the last run into ``output`` with ``request`` (the
    submit body without ``after_seq``; one uncompressed or gzip JSONL file), and append it to ``output``
    (docs/command-line.md: Command-line client; ``incremental``). Raises like ``export``.
    """
    history = incremental.resume(output, conversation_id=conversation_id, request=request)
    operation = await _until_ended(
        api,
        conversation_id=conversation_id,
        request={**request, "after_seq": history.next_after_seq},
        output=output,
        progress=progress,
    )
    if operation["state"] != "SUCCEEDED":
        return ExportOutcome(operation, None)
    result = operation["result"]
    piece = await fetch_verified(api, result, output)
    # APIs from before next_after_seq documented the same watermark as snapshot.max_seq (docs/api.md: Operations,
    # Operation), so a history goes on against either.
    watermark = result["next_after_seq"] if "next_after_seq" in result else operation["snapshot"]["max_seq"]
    pending = incremental.append(output, history, piece, next_after_seq=watermark)
    # Gone before the watermark moves: left behind, it would hold the old after_seq and refuse the next run.
    # Gone too soon (a crash before the commit) only costs an export of the same messages again.
    state_path(output).unlink(missing_ok=True)
    incremental.commit(output, pending)
    return ExportOutcome(
        operation, [Downloaded(output, result["message_count"], result["size_bytes"], result["sha256"])]
    )


async def _until_ended(
    api: Api, *, conversation_id: str, request: dict[str, Any], output: Path, progress: ProgressDisplay
) -> dict[str, Any]:
    """Submit (or submit again, with the stored key) and wait: the operation's terminal representation. The
    state file is dropped when the submit is refused or the export did not succeed.
    """
    state = _resume_or_start(output, conversation_id=conversation_id, request=request)
    try:
        submitted = await api.submit(conversation_id, request, idempotency_key=state.idempotency_key)
    except ApiError:
        # Refused: no export started under this key (or its replay window is over), so nothing is resumable.
        state_path(output).unlink(missing_ok=True)
        raise
    async with progress:
        operation = await until_terminal(api, submitted.operation, progress.observe)
    if operation["state"] != "SUCCEEDED":
        state_path(output).unlink(missing_ok=True)
    return operation


def _resume_or_start(output: Path, *, conversation_id: str, request: dict[str, Any]) -> ExportState:
    path = state_path(output)
    state = read_state(path, ExportState)
    if state is None:
        state = ExportState(f"cli-{secrets.token_urlsafe(18)}", conversation_id, request)
        write_state(path, state)
    elif (state.conversation_id, state.request) != (conversation_id, request):
        raise UnusableStateFile(
            f"{path} belongs to an export of {state.conversation_id} {state.request}; remove it to start this one"
        )
    return state
