"""What ``make test`` needs on this host besides Python 3.11 and the PostgreSQL and RabbitMQ servers it talks to
(docs/development.md: Development, Prerequisites): the programs the tests run themselves. ``make test`` runs
``python -m devtools.prerequisites`` before anything else, so that a host without one hears which package to
install at once, rather than from a test that fails half-way through the run.

Each prerequisite is looked for where its users look for it: the browser and its driver at the paths the web
page's test drives (``tests/conftest.py``), libfaketime where the fault harness preloads it from
(``tests/chaos/faults.py``), the PostgreSQL and RabbitMQ server programs where ``devtools.servers`` finds them for
the private servers of the fault and cluster tests, ``pg_dump`` on ``PATH`` for the schema snapshot's test
(``devtools.schema``). The package names are Debian's, as ``.ci/run`` installs them.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from devtools.servers import ServerError, postgres_bindir, rabbitmq_server_script

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# The multi-threaded build: a worker has threads.
FAKETIME_LIBRARY = "/usr/lib/*/faketime/libfaketimeMT.so.1"


@dataclass(frozen=True)
class Prerequisite:
    """A program (or library) the tests run: ``locate()`` is where it is, or None when this host lacks it;
    ``package`` the Debian package that provides it; ``used_by`` which tests need it, for the report.
    """

    name: str
    package: str
    used_by: str
    locate: Callable[[], Path | None]


def _file(path: str) -> Callable[[], Path | None]:
    return lambda: Path(path) if Path(path).is_file() else None


def _first_match(pattern: str) -> Callable[[], Path | None]:
    return lambda: next((Path(found) for found in sorted(glob.glob(pattern))), None)


def _on_path(program: str) -> Callable[[], Path | None]:
    def locate() -> Path | None:
        found = shutil.which(program)
        return None if found is None else Path(found)

    return locate


def _postgres_program(program: str) -> Callable[[], Path | None]:
    def locate() -> Path | None:
        try:
            path = postgres_bindir() / program
        except ServerError:
            return None
        return path if path.is_file() else None

    return locate


def _rabbitmq_program(program: str) -> Callable[[], Path | None]:
    def locate() -> Path | None:
        try:
            path = rabbitmq_server_script().parent / program
        except ServerError:
            return None
        return path if path.is_file() else None

    return locate


PAGE_TEST = "the web page's test"
PRIVATE_SERVERS = "the fault, chaos and cluster tests' private servers"

PREREQUISITES: tuple[Prerequisite, ...] = (
    Prerequisite("chromium", "chromium", PAGE_TEST, _file(CHROMIUM)),
    Prerequisite("chromedriver", "chromium-driver", PAGE_TEST, _file(CHROMEDRIVER)),
    Prerequisite("libfaketime", "faketime", "the fault harness's clock shifts", _first_match(FAKETIME_LIBRARY)),
    *(
        Prerequisite(program, "postgresql", PRIVATE_SERVERS, _postgres_program(program))
        for program in ("initdb", "postgres", "pg_basebackup", "psql")
    ),
    Prerequisite("pg_dump", "postgresql-client", "the schema snapshot's test", _on_path("pg_dump")),
    Prerequisite("promtool", "prometheus", "the alert rules' test", _on_path("promtool")),
    *(
        Prerequisite(program, "rabbitmq-server", PRIVATE_SERVERS, _rabbitmq_program(program))
        for program in ("rabbitmq-server", "rabbitmqctl")
    ),
)


def missing(prerequisites: Sequence[Prerequisite] = PREREQUISITES) -> list[Prerequisite]:
    """The ``prerequisites`` this host lacks, in their order."""
    return [prerequisite for prerequisite in prerequisites if prerequisite.locate() is None]


def report(lacking: Sequence[Prerequisite]) -> str:
    """What to tell the developer about ``lacking`` (not empty): each one with its package and its users, and
    the ``apt-get`` line that installs them all (with ``sudo`` unless we are root).
    """
    lines = ["make test needs programs that this host lacks:"]
    lines += [f"  {item.name} (package {item.package}), for {item.used_by}" for item in lacking]
    packages = " ".join(dict.fromkeys(item.package for item in lacking))
    sudo = "" if os.geteuid() == 0 else "sudo "
    lines += [
        "Install them, then run make test again:",
        f"  {sudo}apt-get update && {sudo}apt-get install -y {packages}",
    ]
    return "\n".join(lines)


def main(prerequisites: Sequence[Prerequisite] = PREREQUISITES) -> int:
    """Exit status 0 when this host has every one of ``prerequisites``; else 1, with the report on stderr."""
    lacking = missing(prerequisites)
    if lacking:
        print(report(lacking), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
