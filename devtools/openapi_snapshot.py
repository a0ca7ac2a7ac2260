"""The API's contract as a file: ``docs/openapi.json`` is the OpenAPI document the API serves, written by
``python -m devtools.openapi_snapshot`` (docs/development.md: The API's contract). A test compares it with the
document as the code builds it, so a change of the API that nobody meant fails, and one that was meant is a
regenerated file in the same commit, reviewed as a diff.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from services.api.openapi import build_document

SNAPSHOT = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"
# The package's version changes with every release and means nothing to the contract.
VERSION = "snapshot"


def document() -> dict[str, Any]:
    """The document as the code builds it, its ``info.version`` set to ``VERSION``."""
    built = build_document()
    built["info"]["version"] = VERSION
    return built


def render(built: dict[str, Any]) -> str:
    """The snapshot's text: keys sorted, one-space indents, a final newline."""
    return json.dumps(built, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> int:
    """Write the snapshot anew."""
    SNAPSHOT.write_text(render(document()), encoding="utf-8")
    print(f"wrote {SNAPSHOT.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
