"""An application the tests no longer serve is collected (``tests.support.apps``): without that, every test's
api stayed in memory with its S3 clients until the session ended.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from services.api.app import init_app
from shared.settings import Settings
from tests.support.apps import forget_built_apps


async def served_and_closed(settings: Settings) -> weakref.ref[Any]:
    """Serve one request with a new api, close it, and return a weak reference to its application."""
    app = init_app(settings)
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/v3/operations/op_nobody")
        assert response.status == 401  # the request went through the middlewares
    return weakref.ref(app)


async def test_a_closed_api_is_collected_once_the_built_apps_are_forgotten(settings: Settings, s3: Any) -> None:
    app = await served_and_closed(settings)
    gc.collect()
    assert app() is not None  # aiohttp's middleware chain cache still holds it
    forget_built_apps()
    gc.collect()
    assert app() is None
