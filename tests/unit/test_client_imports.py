"""The command-line client talks HTTP only: importing it loads no module of the server (README: Command-line
client), so it works against any deployment and could ship on its own.
"""

from __future__ import annotations

import subprocess
import sys

PROBE = (
    "import sys, chatexport.client.commands; "
    "print(sorted(m for m in sys.modules if m.split('.')[0] in ('services', 'shared', 'devtools')))"
)


def test_the_client_imports_no_server_code() -> None:
    loaded = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "[]"
