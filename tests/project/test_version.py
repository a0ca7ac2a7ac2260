"""One version in one place (docs/deploy.md: Upgrading): ``pyproject.toml``'s, which the command, the OpenAPI
document and every part's ``chatexport_build_info`` show."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from prometheus_client import REGISTRY

from services.api.openapi import build_document
from shared.version import VERSION

REPO = Path(__file__).resolve().parents[2]


def test_the_command_the_document_and_the_metric_show_the_projects_version() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert declared == VERSION
    shown = subprocess.run(
        [sys.executable, "-m", "chatexport.cli", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert shown.strip() == f"chatexport {declared}"
    assert build_document()["info"]["version"] == declared
    assert REGISTRY.get_sample_value("chatexport_build_info", {"version": declared}) == 1.0
