"""Benchmark: what the worst refused body costs the api's event loop (docs/api.md: Error codes, Validation
problems). Each body is as large as ``CHATEXPORT_EXPORT_REQUEST_MAX_BYTES`` (64 KiB by default) allows and
breaks the schema in one of the ways that once made thousands of errors: unknown members at the top or in
``notify``, wrong senders. For a submit's and a schedule's model, the time from the raw bytes to the rendered
422 (``parse_json``, ``check_members``, ``validate``, the problem's bytes), which all run on the event loop,
is measured ``REPEATS`` times in a row; the median and the worst are printed with the answer's size. Usage:

    .venv/bin/python bench/refusal_cost.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.api.http.bodies import check_members, parse_json, validate
from services.api.http.problems import ProblemError
from services.api.http.schemas import ExportScheduleSubmission, ExportSubmission
from shared.settings import Settings

REPEATS = 200
LIMIT = Settings.model_fields["export_request_max_bytes"].default
SHAPES: dict[str, Callable[[int], Any]] = {
    "unknown members": lambda n: {f"f{i}": 0 for i in range(n)},
    "unknown notify members": lambda n: {"notify": {f"f{i}": 0 for i in range(n)}},
    "wrong senders": lambda n: {"senders": [0] * n},
}


def largest(shape: Callable[[int], Any]) -> bytes:
    """The largest body of ``shape`` within ``LIMIT`` bytes (a bisection on its count of members)."""
    low, high = 1, LIMIT
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if len(json.dumps(shape(middle)).encode()) <= LIMIT else (low, middle)
    return json.dumps(shape(low)).encode()


def refusal(model: type[Any], raw: bytes) -> bytes:
    """The answer the api renders for ``raw`` as ``model``'s body."""
    try:
        data = parse_json(raw)
        check_members(model, data)
        validate(model, data)
    except ProblemError as problem:
        body: bytes = problem.response().body  # type: ignore[assignment]
        return body
    raise AssertionError("the body was accepted")


def main() -> None:
    """Print one line per body and model: its size, the answer's, and the median and worst time in ms."""
    for name, shape in SHAPES.items():
        raw = largest(shape)
        for model in (ExportSubmission, ExportScheduleSubmission):
            seconds = []
            for _ in range(REPEATS):
                started = time.perf_counter()
                answer = refusal(model, raw)
                seconds.append(time.perf_counter() - started)
            print(
                f"{name:24} {model.__name__:26} body {len(raw):6} B  answer {len(answer):5} B  "
                f"median {statistics.median(seconds) * 1000:.2f} ms  worst {max(seconds) * 1000:.2f} ms"
            )


if __name__ == "__main__":
    main()
