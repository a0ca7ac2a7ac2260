"""The quick start of docs/deploy.md (its first shell block) starts what it says: it exports every variable
that ``deploy/compose.yaml`` requires (``${VAR:?message}``), and, with the exports in the head comment of
``deploy/compose.cluster.yaml``, every one that the cluster variant merged over it requires.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from devtools.compose import CLUSTER_COMPOSE_FILE, COMPOSE_FILE, load_compose, required_variables

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
# A value long enough for every secret the parts check (a JWT secret needs 32 bytes).
VALUE = "q" * 48


def exported(commands: str) -> set[str]:
    """The names that the ``export NAME=...`` commands among ``commands`` (shell lines) set."""
    names: set[str] = set()
    for line in commands.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            names |= {word.partition("=")[0] for word in words[1:]}
    return names


def quick_start() -> str:
    """The first ``sh`` block of docs/deploy.md."""
    found = re.search(r"^```sh\n(.*?)^```$", DEPLOY, flags=re.MULTILINE | re.DOTALL)
    assert found, "docs/deploy.md has no shell block"
    return found[1]


def cluster_exports() -> str:
    """The shell lines of ``deploy/compose.cluster.yaml``'s head comment (``#   command``)."""
    head = CLUSTER_COMPOSE_FILE.read_text(encoding="utf-8").split("\n\n", 1)[0]
    return "\n".join(line.removeprefix("#").strip() for line in head.splitlines() if line.startswith("#   "))


def test_the_reader_finds_exports_and_required_variables(tmp_path: Path) -> None:
    assert exported('export A="$(openssl rand -hex 4)" B=1  # a comment\nexport C=2\necho D=3\n') == {"A", "B", "C"}
    compose = tmp_path / "compose.yaml"
    compose.write_text("# ${IN_A_COMMENT:?no}\nx: ${A:?set A} $${ESCAPED:?no} ${B?} ${C:-c} ${D-d} $E\n")
    assert required_variables(compose) == {"A", "B"}


def test_the_quick_start_exports_every_variable_the_compose_file_requires() -> None:
    required = required_variables(COMPOSE_FILE)
    assert {"CHATEXPORT_JWT_SECRET", "CHATEXPORT_WEBHOOK_SIGNING_KEY"} <= required
    assert required <= exported(quick_start())
    load_compose(variables=dict.fromkeys(exported(quick_start()), VALUE))


def test_the_cluster_variant_with_the_quick_start_exports_every_variable_it_requires() -> None:
    names = exported(quick_start()) | exported(cluster_exports())
    assert required_variables(COMPOSE_FILE, CLUSTER_COMPOSE_FILE) <= names
    load_compose(variables=dict.fromkeys(names, VALUE), overrides=[CLUSTER_COMPOSE_FILE])
