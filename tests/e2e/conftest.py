"""The end-to-end system: the compose file's services as real processes for the whole e2e session, on a
database of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from devtools.localsystem import LocalSystem
from tests.support import cloned_database
from tests.support.e2e import Browser, headers_for, local_system

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
async def e2e_database(template_db: str) -> AsyncIterator[str]:
    """A migrated database for the e2e session."""
    async with cloned_database(template_db, "chatexport_e2e") as url:
        yield url


@pytest.fixture(scope="session")
async def system(e2e_database: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalSystem]:
    """The end-to-end system of the session (``local_system``), with short leases."""
    log_dir = tmp_path_factory.mktemp("e2e-logs")
    overrides = {"CHATEXPORT_LEASE_SECONDS": "10", "CHATEXPORT_HEARTBEAT_SECONDS": "2"}
    async with local_system(e2e_database, log_dir, **overrides) as local:
        yield local


@pytest.fixture
async def api(system: LocalSystem) -> AsyncIterator[aiohttp.ClientSession]:
    """HTTP over a real socket to the system's API (paths are relative to its base URL)."""
    async with aiohttp.ClientSession(base_url=system.base_url) as session:
        yield session


@pytest.fixture(scope="session")
def auth(system: LocalSystem) -> Callable[..., dict[str, str]]:
    """``headers_for`` the session's system."""
    return headers_for(system)


CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    """Headless chromium whose downloads land in ``tmp_path / "downloads"``."""
    assert Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(), "install chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(argument)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads)})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield Browser(driver, downloads)
    finally:
        driver.quit()
