"""Fixtures of the integration tests: the pipeline's background parts as tasks in the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared.settings import Settings
from tests.helpers import running_pipeline


@pytest.fixture
async def pipeline(settings: Settings, s3: Any) -> AsyncIterator[None]:
    """Relay, worker and janitor running as tasks until the test ends."""
    async with running_pipeline(settings):
        yield
