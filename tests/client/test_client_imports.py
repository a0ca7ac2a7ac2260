"""The command-line client talks HTTP only: it imports no module of the server (docs/command-line.md: Command-line
client), so it works against any deployment and could ship on its own. What it needs of the server (formats, states)
it takes from the API's answers.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[2] / "chatexport" / "client"
SERVER_PACKAGES = ("services", "shared", "devtools", "tests")
PROBE = (
    "import sys, chatexport.client.commands; "
    f"print(sorted(m for m in sys.modules if m.split('.')[0] in {SERVER_PACKAGES!r}))"
)


def imported_packages(source: str) -> set[str]:
    """The top-level packages ``source`` imports, wherever the import statement is."""
    packages: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            packages.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            packages.add(node.module.split(".")[0])
    return packages


@pytest.mark.parametrize("module", sorted(CLIENT.rglob("*.py")), ids=lambda path: path.name)
def test_no_client_module_imports_server_code(module: Path) -> None:
    assert not imported_packages(module.read_text(encoding="utf-8")) & set(SERVER_PACKAGES)


def test_the_probe_sees_an_import_of_server_code() -> None:
    assert imported_packages("def f():\n    from shared import formats\n") == {"shared"}


def test_importing_the_client_loads_no_server_code() -> None:
    loaded = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "[]"
