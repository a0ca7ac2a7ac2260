"""The command line's argument types, shared by the client's commands and the service's own
(``chatexport.cli``): light to import, so that a part's process, which parses no client command, loads
nothing of the client.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import TypeVar

Number = TypeVar("Number", int, float)


def positive(parse: Callable[[str], Number], what: str, refusal: str) -> Callable[[str], Number]:
    """An argparse type: ``value`` read with ``parse`` (``int``, ``float``) when it is above 0 and finite; else
    ``ArgumentTypeError`` saying that it is not ``what``, or ``refusal``.
    """

    def read(value: str) -> Number:
        try:
            number = parse(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None
        if not 0 < number < float("inf"):
            raise argparse.ArgumentTypeError(refusal)
        return number

    return read


def matching(pattern: re.Pattern[str], refusal: str) -> Callable[[str], str]:
    """An argparse type: ``value`` when ``pattern`` matches all of it; else ``ArgumentTypeError(refusal)``."""

    def read(value: str) -> str:
        if not pattern.fullmatch(value):
            raise argparse.ArgumentTypeError(refusal)
        return value

    return read


positive_seconds = positive(float, "a number of seconds", "must be a positive number of seconds")
positive_int = positive(int, "a whole number", "must be at least 1")
