"""The previous release, built once per machine and commit (``devtools.releases``), for the upgrade tests."""

from __future__ import annotations

import pytest

from devtools.releases import Release, build_release, previous_release


@pytest.fixture(scope="session")
def previous() -> Release:
    """The release CHANGELOG.md names last, checked out and installed (a minute the first time)."""
    return build_release(*previous_release())
