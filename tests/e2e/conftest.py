"""The end-to-end system: one set of real processes for the whole e2e session, on its own database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest

from shared.auth import mint_token
from shared.settings import Settings
from tests.conftest import AMQP_URL, cloned_database, delete_broker_objects
from tests.e2e.system import LocalSystem

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
async def e2e_database(template_db: str) -> AsyncIterator[str]:
    """A migrated database for the e2e session."""
    async with cloned_database(template_db, "chatexport_e2e") as url:
        yield url


@pytest.fixture(scope="session")
async def system(e2e_database: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalSystem]:
    """moto, api, relay, two workers and janitor as real processes, stopped at the end of the session."""
    log_dir: Path = tmp_path_factory.mktemp("e2e-logs")
    local = LocalSystem(
        database_url=e2e_database,
        amqp_url=AMQP_URL,
        log_dir=log_dir,
        overrides={
            "CHATEXPORT_JANITOR_INTERVAL_SECONDS": "1",
            "CHATEXPORT_LEASE_SECONDS": "10",
            "CHATEXPORT_HEARTBEAT_SECONDS": "2",
        },
    )
    try:
        local.start(workers=2)
        yield local
    finally:
        codes = local.stop()
        await delete_broker_objects(local.settings())
        assert all(code in (0, -15) for name, code in codes.items() if name != "moto"), codes


@pytest.fixture
async def api(system: LocalSystem) -> AsyncIterator[aiohttp.ClientSession]:
    """HTTP over a real socket to the system's API (paths are relative to its base URL)."""
    async with aiohttp.ClientSession(base_url=system.base_url) as session:
        yield session


@pytest.fixture
def auth() -> Callable[..., dict[str, str]]:
    """``auth("u-a")`` -> headers with a token from the system's (development) secret."""
    settings = Settings()

    def headers(user_id: str, *, admin: bool = False) -> dict[str, str]:
        token = mint_token(settings, user_id=user_id, scopes=["admin"] if admin else None)
        return {"Authorization": f"Bearer {token}"}

    return headers
