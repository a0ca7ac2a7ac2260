"""Fixtures of the integration tests: the pipeline's background parts as tasks in the test's event loop, and
a conversation to send to. (``module_database/conftest.py`` gives the modules of that folder one database
per module.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from shared.settings import Settings
from tests.helpers import make_conversation, running_pipeline


@pytest.fixture
async def pipeline(settings: Settings, s3: Any) -> AsyncIterator[None]:
    """Relay, worker and janitor running as tasks until the test ends."""
    async with running_pipeline(settings):
        yield


@pytest.fixture
async def chat(api: Any, auth: Callable[..., dict[str, str]]) -> str:
    """Conversation ``c-a`` with members ``u-a`` and ``u-b``."""
    await make_conversation(api, auth, "c-a", ["u-a", "u-b"])
    return "c-a"
