"""The ``chatexport`` console script. Loading the command imports every part, which takes a second or more;
a Ctrl-C in that time ends it as a Ctrl-C later does, quietly with exit code 130, not with a traceback
(docs/command-line.md: Command line).
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

EXIT_INTERRUPTED = 130


def _interrupted(_signum: int, _frame: FrameType | None) -> None:
    print("chatexport: interrupted", file=sys.stderr)
    raise SystemExit(EXIT_INTERRUPTED)


def main() -> int:
    """Load ``chatexport.cli`` with Ctrl-C ending the load quietly, then run it with Python's own handler."""
    previous = signal.signal(signal.SIGINT, _interrupted)
    try:
        from chatexport import cli
    finally:
        signal.signal(signal.SIGINT, previous)
    return cli.main()
