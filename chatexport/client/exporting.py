"""``chatexport export``: submit, wait, download and verify, resumable at every step (README: Command-line
client).

The Idempotency-Key is stored in ``FILE.part.json`` before the first submit, so running the same command
again after Ctrl-C, a crash or a lost 202 submits with the same key and so follows the same operation
instead of starting another. The state file goes once the export has ended: verified in place, or failed.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chatexport.client.api import Api, ApiError
from chatexport.client.download import download_result
from chatexport.client.progress import Progress
from chatexport.client.waiting import until_terminal


class UnusableStateFile(Exception):
    """The state file beside the output is not this command's, or belongs to another export (another
    conversation or range): the user must look at it, so the command stops before any request.
    """


@dataclass(frozen=True)
class ExportState:
    """What a run remembers beside its output: the key it submits with, and what it asked for."""

    idempotency_key: str
    conversation_id: str
    request: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    """How an export run ended: the operation's last representation, and the file when it was written."""

    operation: dict[str, Any]
    written: Path | None


def state_path(output: Path) -> Path:
    """The state file of an export into ``output``."""
    return output.with_name(output.name + ".part.json")


async def export(
    api: Api, *, conversation_id: str, request: dict[str, Any], output: Path, progress: Progress
) -> Outcome:
    """Export ``conversation_id`` with ``request`` (the submit body) into ``output``. Raises ``ApiError``,
    ``aiohttp.ClientError``, ``NotVerified``, ``UnusableStateFile`` and ``OSError`` for the local files.
    """
    state = _resume_or_start(output, conversation_id=conversation_id, request=request)
    try:
        submitted = await api.submit(conversation_id, request, idempotency_key=state.idempotency_key)
    except ApiError:
        # Refused: no export started under this key (or its replay window is over), so nothing is resumable.
        state_path(output).unlink(missing_ok=True)
        raise
    with progress:
        operation = await until_terminal(api, submitted.operation, progress.observe)
    if operation["state"] != "SUCCEEDED":
        state_path(output).unlink(missing_ok=True)
        return Outcome(operation, None)
    await download_result(api, operation, output)
    state_path(output).unlink(missing_ok=True)
    return Outcome(operation, output)


def _resume_or_start(output: Path, *, conversation_id: str, request: dict[str, Any]) -> ExportState:
    path = state_path(output)
    if path.exists():
        try:
            state = ExportState(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            raise UnusableStateFile(f"{path} is not a state file of this command; remove it") from None
        if (state.conversation_id, state.request) != (conversation_id, request):
            raise UnusableStateFile(
                f"{path} belongs to an export of {state.conversation_id} {state.request}; remove it to start this one"
            )
        return state
    state = ExportState(f"cli-{secrets.token_urlsafe(18)}", conversation_id, request)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(asdict(state)))
    os.replace(temporary, path)
    return state
