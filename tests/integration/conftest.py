"""Fixtures and helpers for integration tests: the pipeline's background parts as tasks in the test's
event loop, and small HTTP helpers over the real API.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.janitor.main import serve as serve_janitor
from services.relay.main import serve as serve_relay
from services.worker.main import serve as serve_worker
from shared.settings import Settings
from tests.helpers import (  # noqa: F401 - re-exported for the integration tests
    Headers,
    expected_file,
    import_lines,
    make_conversation,
    read_all,
    submit,
    wait_terminal,
)


@pytest.fixture
async def pipeline(settings: Settings, s3: Any) -> AsyncIterator[None]:
    """Relay, worker and janitor running as tasks until the test ends."""
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(serve(settings, stop=stop), name=serve.__module__)
        for serve in (serve_relay, serve_worker, serve_janitor)
    ]
    yield
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
