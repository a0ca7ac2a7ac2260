"""The lock files (docs/development.md: Dependencies): every requirement of ``pyproject.toml`` pinned in them at a
version it allows, every pin with its hashes, and the development lock one resolution with the runtime one
(each runtime package at the same version in both)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
RUNTIME_LOCK = REPO / "requirements" / "runtime.lock"
DEV_LOCK = REPO / "requirements" / "dev.lock"


def pins(lock: Path) -> dict[str, str]:
    """Package name (canonical) -> pinned version, having checked that each pin carries a hash."""
    text = lock.read_text()
    entries = re.findall(
        r"^([A-Za-z0-9_.\-]+)==([^\s\\]+)((?:\s*\\\n\s+--hash=sha256:[0-9a-f]{64})+)", text, re.MULTILINE
    )
    pinned_lines = re.findall(r"^[A-Za-z0-9_.\-]+==", text, re.MULTILINE)
    assert len(entries) == len(pinned_lines), f"{lock.name}: a pin without its hashes"
    return {canonicalize_name(name): version for name, version, _ in entries}


def requirements(*extras: str) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = [*project["dependencies"], *(line for extra in extras for line in project["optional-dependencies"][extra])]
    return [Requirement(line) for line in listed]


def test_the_runtime_lock_pins_every_runtime_requirement_at_an_allowed_version() -> None:
    locked = pins(RUNTIME_LOCK)
    for requirement in requirements():
        version = locked.get(canonicalize_name(requirement.name))
        assert version is not None and requirement.specifier.contains(version, prereleases=True), str(requirement)


def test_the_development_lock_is_one_resolution_with_the_runtime_lock() -> None:
    runtime, development = pins(RUNTIME_LOCK), pins(DEV_LOCK)
    for requirement in requirements("dev", "demo"):
        version = development.get(canonicalize_name(requirement.name))
        assert version is not None and requirement.specifier.contains(version, prereleases=True), str(requirement)
    assert {name: development.get(name) for name in runtime} == runtime


def test_the_image_and_make_install_install_from_the_locks_with_hashes() -> None:
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    assert "pip install --require-hashes -r requirements/runtime.lock" in dockerfile
    assert "pip install --no-deps ." in dockerfile
    makefile = (REPO / "Makefile").read_text()
    assert "--require-hashes -r requirements/dev.lock" in makefile
    assert "--no-deps -e ." in makefile
