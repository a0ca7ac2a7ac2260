"""The previous release, built from this repository's history for the upgrade tests (docs/deploy.md: Upgrading,
The live upgrade test).

The previous release is the newest section of CHANGELOG.md with a ``Commit:`` line. ``build_release`` checks
that commit out as a ``git worktree`` and gives it a virtualenv of its own, installed from the release's own
lock file when it has one (``requirements/dev.lock``), else from its ``pyproject.toml``. Both are kept in a
cache folder per commit (``CHATEXPORT_RELEASE_CACHE``, default ``~/.cache/chatexport/releases``), so only the
first run on a machine pays for them (about a minute).

``python -m devtools.releases`` builds the previous release and prints where it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHANGELOG = REPO / "CHANGELOG.md"
CACHE_ENV = "CHATEXPORT_RELEASE_CACHE"
# A release section's heading and the Commit: line right under it (docs/development.md: Cutting a release).
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\][^\n]*\n+Commit: ([0-9a-f]{7,40})$", re.MULTILINE)
READY = "ready"  # written last into a release's cache folder: what is there is whole
INSTALL_TIMEOUT_SECONDS = 900.0
# What a release passes to its parts, by the first release that read it: an older one binds its own ports.
SOCKET_FD_SETTING = "api_socket_fd"


@dataclass(frozen=True)
class Release:
    """A release ready to run: its ``version``, full ``commit``, the worktree ``root`` its processes run in
    (as their working directory, so that ``python -m chatexport.cli`` imports its own code) and the
    ``python`` of its virtualenv.
    """

    version: str
    commit: str
    root: Path
    python: Path

    @property
    def takes_sockets(self) -> bool:
        """Whether its parts serve on listening sockets handed to them (``CHATEXPORT_*_SOCKET_FD``)."""
        return SOCKET_FD_SETTING in (self.root / "shared" / "settings.py").read_text(encoding="utf-8")


def previous_release(changelog: Path = CHANGELOG) -> tuple[str, str]:
    """``(version, commit)`` of the newest release in ``changelog`` that names its commit; raises
    ``LookupError`` when none does.
    """
    found = RELEASE.search(changelog.read_text(encoding="utf-8"))
    if found is None:
        raise LookupError(f"{changelog.name} names no release with a Commit: line")
    return found[1], found[2]


def build_release(version: str, commit: str, *, cache: Path | None = None) -> Release:
    """The release ``version`` at ``commit`` (a hash this clone has), built into ``cache`` unless it is there.

    Two processes that build one release at once take turns on a lock file; the second finds it built.
    Raises ``subprocess.CalledProcessError`` (with the tail of what failed in ``stderr``) when git or pip
    fails (a commit missing from a shallow clone, a package the index lacks), ``subprocess.TimeoutExpired``
    past ``INSTALL_TIMEOUT_SECONDS``.
    """
    full = _git("rev-parse", "--verify", f"{commit}^{{commit}}").strip()
    folder = (cache or _default_cache()) / full
    folder.parent.mkdir(parents=True, exist_ok=True)
    python = folder / "venv" / "bin" / "python"
    release = Release(version=version, commit=full, root=folder / "source", python=python)
    with _locked(folder.parent / f"{full}.lock"):
        if not ((folder / READY).exists() and _runs(release)):
            _build(release, folder)
    return release


def _runs(release: Release) -> bool:
    """Whether the cached virtualenv still starts, and imports its release (the interpreter it was made from
    may have been upgraded or removed since)."""
    check = [str(release.python), "-c", "import chatexport, aiohttp, asyncpg"]
    try:
        done = subprocess.run(check, cwd=release.root, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _build(release: Release, folder: Path) -> None:
    if folder.exists():  # a build that was interrupted
        shutil.rmtree(folder)
    _git("worktree", "prune")
    folder.mkdir()
    _git("worktree", "add", "--detach", "--force", str(release.root), release.commit)
    # The base interpreter, not this virtualenv's: the release's packages must not see ours.
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(folder / "venv")], check=True, timeout=INSTALL_TIMEOUT_SECONDS)
    lock = release.root / "requirements" / "dev.lock"
    if lock.exists():
        _pip(release, "--require-hashes", "-r", str(lock))
        _pip(release, "--no-deps", "-e", str(release.root))
    else:
        _pip(release, "-e", f"{release.root}[dev,demo]")
    (folder / READY).write_text(f"{release.version} {release.commit}\n", encoding="utf-8")


def _pip(release: Release, *args: str) -> None:
    command = [str(release.python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECONDS)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, command, done.stdout, done.stderr[-4000:])


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout


def _default_cache() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chatexport" / "releases"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def main() -> None:
    """Build the previous release and print its version, commit, folder and interpreter."""
    release = build_release(*previous_release())
    print(f"{release.version} {release.commit}\n{release.root}\n{release.python}")


if __name__ == "__main__":
    main()
