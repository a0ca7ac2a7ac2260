"""The OpenAPI document keeps its meaning: against the committed baseline (``openapi_baseline.json``, the
document as it was before the code that builds it was reorganised), only descriptions and summaries may
differ, and the additions named in ``ADDED``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.api.openapi import build_document

BASELINE = Path(__file__).with_name("openapi_baseline.json")
PROSE = frozenset({"description", "summary"})
# (path of keys into the document, value) that the document gained on purpose since the baseline.
ADDED: list[tuple[tuple[str, ...], Any]] = []


def _without_prose(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _without_prose(value) for key, value in node.items() if key not in PROSE}
    if isinstance(node, list):
        return [_without_prose(item) for item in node]
    return node


def _baseline_with_additions() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(BASELINE.read_text())
    for keys, value in ADDED:
        *parents, last = keys
        node = document
        for key in parents:
            node = node[key]
        node[last] = value
    return document


def test_the_document_means_what_the_baseline_means() -> None:
    document = build_document()
    document["info"]["version"] = "baseline"
    assert _without_prose(document) == _without_prose(_baseline_with_additions())


def test_prose_is_all_the_comparison_leaves_out() -> None:
    changed = _baseline_with_additions()
    changed["paths"]["/v3/operations/{operation_id}"]["get"]["operationId"] = "renamed"
    assert _without_prose(changed) != _without_prose(json.loads(BASELINE.read_text()))
