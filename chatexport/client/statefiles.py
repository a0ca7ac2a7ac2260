"""The small JSON files the client keeps beside an output so that a run can be taken up again (docs/command-line.md:
Command-line client): each holds one dataclass, and is replaced atomically.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

State = TypeVar("State")


class UnusableStateFile(Exception):
    """A state file beside the output is not this command's, belongs to another export (another
    conversation or request), or does not match its output: the user must look at it, so the command stops
    before any request.
    """


def read_state(path: Path, kind: type[State]) -> State | None:
    """The ``kind`` (a dataclass) stored in ``path``, or None when there is no such file. Raises
    ``UnusableStateFile`` when the file does not hold one, ``OSError`` when it cannot be read.
    """
    if not path.exists():
        return None
    try:
        return kind(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        raise UnusableStateFile(f"{path} is not a state file of this command; remove it") from None


def write_state(path: Path, state: Any) -> None:
    """Store ``state`` (a dataclass) in ``path``: written beside it and renamed over it, so a crash leaves
    the old state or the new one, never a mix. Raises ``OSError``.
    """
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w") as file:
        file.write(json.dumps(asdict(state)))
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
