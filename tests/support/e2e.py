"""Helpers of the end-to-end tests: the system as real processes, tokens for it, and the browser handle."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from selenium.webdriver.chrome.webdriver import WebDriver

from devtools.broker import delete_broker_objects
from devtools.localsystem import LocalSystem
from shared.auth import mint_token
from tests.support import AMQP_URL, TEST_RATE_LIMIT_ENV


@contextlib.asynccontextmanager
async def local_system(database_url: str, log_dir: Path, **overrides: str) -> AsyncIterator[LocalSystem]:
    """moto and every part with the compose file's replica counts (api, relay, three workers, two janitors)
    as real processes on ``database_url``, with a one-second janitor and ``overrides`` (setting name ->
    value), stopped at the end of the block, when each must have exited cleanly.
    """
    local = LocalSystem(
        database_url=database_url,
        amqp_url=AMQP_URL,
        log_dir=log_dir,
        overrides={
            "CHATEXPORT_JANITOR_INTERVAL_SECONDS": "1",
            **TEST_RATE_LIMIT_ENV,
            **overrides,
        },
    )
    try:
        local.start()
        yield local
    finally:
        codes = local.stop()
        await delete_broker_objects(local.settings())
        assert all(code in (0, -15) for name, code in codes.items() if name != "moto"), codes


def headers_for(system: LocalSystem) -> Callable[..., dict[str, str]]:
    """``auth("u-a")`` -> headers with a token signed with ``system``'s secret; ``admin=True`` adds the scope."""
    settings = system.settings()

    def headers(user_id: str, *, admin: bool = False) -> dict[str, str]:
        token = mint_token(settings, user_id=user_id, scopes=["admin"] if admin else None)
        return {"Authorization": f"Bearer {token}"}

    return headers


@dataclass(frozen=True)
class Browser:
    """A headless chromium (its own driver class: it reads the browser's logs) and its downloads folder."""

    driver: WebDriver
    downloads: Path
