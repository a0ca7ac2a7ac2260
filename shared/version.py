"""This release's version, read from the installed package's metadata, which ``pyproject.toml`` sets: the one
place it is written (docs/deploy.md: Upgrading). ``chatexport --version``, the OpenAPI document's
``info.version``, every part's start-up log line and its ``chatexport_build_info`` metric show it.
"""

from __future__ import annotations

import importlib.metadata

from prometheus_client import Info

VERSION = importlib.metadata.version("chatexport")

BUILD_INFO = Info("chatexport_build", "The release this part runs: label version")
BUILD_INFO.info({"version": VERSION})
