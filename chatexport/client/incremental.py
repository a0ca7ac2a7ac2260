"""What ``chatexport export --incremental`` remembers between runs (docs/command-line.md: Command-line client): OUTPUT
stays a conversation's complete history, and each run appends what is new since the run before.

``FILE.incremental.json`` beside OUTPUT holds the conversation, the request (the submit body without
``after_seq``), the watermark (the ``next_after_seq`` of the last export appended: the next run's
``after_seq``) and OUTPUT's size then. An append is recorded there before OUTPUT grows (the pending
watermark; the recorded size is OUTPUT's size before the append) and the new watermark and size are saved
after it, so a crash in between is found by the next run, which cuts OUTPUT back to the recorded size and
exports the same messages again: a line is never lost nor written twice.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from chatexport.client.statefiles import UnusableStateFile, read_state, write_state

COPY_BYTES = 256 * 1024


@dataclass(frozen=True)
class History:
    """An incremental export's state: ``request`` is the submit body without ``after_seq``;
    ``next_after_seq`` the watermark; ``output_bytes`` OUTPUT's size when it was saved; ``pending_next_after_seq``
    the watermark of an append under way, None between runs that ended.
    """

    conversation_id: str
    request: dict[str, Any]
    next_after_seq: int = 0
    output_bytes: int = 0
    pending_next_after_seq: int | None = None


def history_path(output: Path) -> Path:
    """The state file of the incremental export into ``output``."""
    return output.with_name(output.name + ".incremental.json")


def resume(output: Path, *, conversation_id: str, request: dict[str, Any]) -> History:
    """The history of ``output`` for an incremental export of ``conversation_id`` with ``request`` (the
    submit body without ``after_seq``): the recorded one, once an append a crash interrupted is undone, or a
    new one (watermark 0) when there is none. Raises ``UnusableStateFile`` when the state file is not ours
    or belongs to another export, when OUTPUT is not the size recorded (something else changed it), or when
    OUTPUT is not empty but has no state file; ``OSError`` for the local files.
    """
    recorded = read_state(history_path(output), History)
    if recorded is None:
        if _size(output):
            raise UnusableStateFile(
                f"{output} is not empty and has no {history_path(output).name}, so it is not an incremental "
                "export's: an incremental export appends only to the file it began; choose another output"
            )
        return History(conversation_id, request)
    _check_recorded(output, recorded, conversation_id=conversation_id, request=request)
    if recorded.pending_next_after_seq is not None:
        recorded = _undo_append(output, recorded)
    _check_output(output, recorded)
    return recorded


def append(output: Path, history: History, piece: Path, *, next_after_seq: int) -> History:
    """Append the verified file ``piece`` to ``output`` (the export of what is new, ending at seq
    ``next_after_seq``) and delete it; return the history to ``commit``, which still shows the append as
    pending. Raises ``UnusableStateFile`` when something else changed OUTPUT meanwhile, ``OSError``.
    """
    _check_output(output, history)
    pending = replace(history, pending_next_after_seq=next_after_seq)
    write_state(history_path(output), pending)
    with output.open("ab") as target, piece.open("rb") as source:
        shutil.copyfileobj(source, target, COPY_BYTES)
        target.flush()
        os.fsync(target.fileno())
    piece.unlink()
    return pending


def commit(output: Path, pending: History) -> History:
    """Save the watermark of the ``pending`` append (``append``'s answer) with OUTPUT's size: the append is
    done. Raises ``OSError``.
    """
    assert pending.pending_next_after_seq is not None, "commit takes what append returned"
    committed = replace(
        pending, next_after_seq=pending.pending_next_after_seq, output_bytes=_size(output), pending_next_after_seq=None
    )
    write_state(history_path(output), committed)
    return committed


def _check_output(output: Path, history: History) -> None:
    size = _size(output)
    if size != history.output_bytes:
        raise UnusableStateFile(
            f"{output} has {size} bytes, but {history_path(output).name} recorded {history.output_bytes}: "
            "something else changed it; remove both to start the history again"
        )


def _check_recorded(output: Path, recorded: History, *, conversation_id: str, request: dict[str, Any]) -> None:
    counts = [recorded.next_after_seq, recorded.output_bytes, recorded.pending_next_after_seq or 0]
    if not (
        isinstance(recorded.conversation_id, str)
        and isinstance(recorded.request, dict)
        and all(type(count) is int and count >= 0 for count in counts)
    ):
        raise UnusableStateFile(f"{history_path(output)} is not a state file of this command; remove it")
    if (recorded.conversation_id, recorded.request) != (conversation_id, request):
        raise UnusableStateFile(
            f"{history_path(output)} belongs to an incremental export of {recorded.conversation_id} "
            f"{recorded.request}; choose another output for this one"
        )


def _undo_append(output: Path, history: History) -> History:
    # The crash came between growing OUTPUT and saving the new watermark: whatever was appended goes, and this
    # run exports the same messages again. A shorter OUTPUT is not ours to cut: ``_check_output`` refuses it next.
    if _size(output) > history.output_bytes:
        with output.open("r+b") as file:
            file.truncate(history.output_bytes)
            os.fsync(file.fileno())
    undone = replace(history, pending_next_after_seq=None)
    write_state(history_path(output), undone)
    return undone


def _size(path: Path) -> int:
    """The size of the file at ``path`` in bytes; 0 when there is none."""
    return path.stat().st_size if path.exists() else 0
