"""JSON text that stays one line for every reader (docs/api.md: Submitting an export, The file).

JSON allows U+0085, U+2028 and U+2029 raw inside strings, but Python's ``str.splitlines``, JavaScript
before ES2019 and many log tools break lines there. Everything the product writes as JSON escapes them as
``\\uXXXX``, like the C0 controls JSON already escapes, so a line is a line for everyone and parsing gives
back the same string. The export file's lines are rendered by Postgres with the same escapes
(``shared.export.rendering.JSONL_LINE_SQL``).
"""

from __future__ import annotations

import json
from typing import Any

# Code points a common reader takes as a line boundary that JSON leaves raw (the C0 controls it escapes).
LINE_BREAKING = ("\u0085", "\u2028", "\u2029")
_ESCAPES = {ord(char): f"\\u{ord(char):04x}" for char in LINE_BREAKING}


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, **options)`` with ``LINE_BREAKING`` escaped."""
    text = json.dumps(value, ensure_ascii=False, **options)
    # translate looks up every character; ASCII text, most answers, holds none of them (docs/benchmark.md: Benchmark).
    return text if text.isascii() else text.translate(_ESCAPES)
