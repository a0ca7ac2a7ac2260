"""Fixtures on the real servers, for every test folder: a Postgres template database cloned per test (or one
database per module, for a module marked ``module_database``), unique RabbitMQ names per test, a moto server
(S3 over real HTTP) per session, the pipeline's background parts as tasks, and the end-to-end system as real
processes (``system``, ``live_api``, ``live_auth``, ``browser``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from devtools.broker import delete_broker_objects
from devtools.localsystem import LocalSystem
from devtools.moto import MotoServer, start_moto
from devtools.prerequisites import CHROMEDRIVER, CHROMIUM
from services.api.app import init_app
from shared.auth import mint_token
from shared.migrator import migrate
from shared.settings import Settings
from shared.storage import ensure_bucket, open_s3_client
from tests.support import PG_SERVER, admin_execute, cloned_database, emptied, make_settings
from tests.support.api_calls import make_conversation, running_pipeline
from tests.support.apps import forget_built_apps
from tests.support.e2e import Browser, headers_for, local_system

# A test's cost follows from the fixtures it uses (docs/development.md: Development): the markers are derived, never
# kept by hand beside them.
_COST_MARKERS = {"system": "e2e", "template_db": "integration", "moto": "integration"}


# The xdist group of every test that holds the session's end-to-end system (``system``): one process of a run
# starts it, where each process would start its own and hold its connections to the shared PostgreSQL until the
# run ends (docs/development.md: Where the time goes).
_SYSTEM_GROUP = "system"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test ``integration`` or ``e2e`` by the server fixtures its closure holds, and give it its
    xdist group (``--dist loadgroup``): ``_SYSTEM_GROUP`` when it holds the session's system, else its file's,
    unless a folder's conftest gave it one (none under ``-p no:xdist``, which does not know the marker). First
    among the hooks, so that xdist's own, which reads the groups, runs after it; a folder's conftest that gives
    groups does so first among them too.
    """
    grouped = config.pluginmanager.hasplugin("xdist")
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for fixture, marker in _COST_MARKERS.items():
            if fixture in fixtures:
                item.add_marker(marker)
        if grouped and item.get_closest_marker("xdist_group") is None:
            group = _SYSTEM_GROUP if "system" in fixtures else item.path.relative_to(item.config.rootpath).as_posix()
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _apps_collectable() -> Iterator[None]:
    """After every test, let go of the aiohttp applications it built (``tests.support.apps``)."""
    yield
    forget_built_apps()


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    """One moto server for the session; each test has its own bucket in it."""
    server = start_moto()
    yield server
    server.stop()


@pytest.fixture(scope="session")
async def template_db() -> AsyncIterator[str]:
    """A migrated database that every test clones (procrastinate's template pattern)."""
    name = f"chatexport_tpl_{uuid.uuid4().hex[:8]}"
    await admin_execute(f'CREATE DATABASE "{name}"')
    await migrate(f"{PG_SERVER}/{name}")
    yield name
    await admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(request: pytest.FixtureRequest) -> str:
    """This test's migrated database: a clone of its own (``cloned_database_url``), or, in a module marked
    ``module_database``, the module's one database emptied before the test (``emptied_module_database``).
    """
    shared = request.node.get_closest_marker("module_database") is not None
    url: str = request.getfixturevalue("emptied_module_database" if shared else "cloned_database_url")
    return url


@pytest.fixture
async def cloned_database_url(template_db: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test, dropped afterwards (a second or more on a busy server)."""
    async with cloned_database(template_db, "chatexport_t") as url:
        yield url


@pytest.fixture(scope="module")
async def module_database(template_db: str) -> AsyncIterator[str]:
    """One clone of the migrated template per test module."""
    async with cloned_database(template_db, "chatexport_m") as url:
        yield url


@pytest.fixture
async def emptied_module_database(module_database: str) -> str:
    """The module's database, emptied before each test, so every test starts from the rows a fresh clone has
    (ids of sequences go on counting; no test depends on their values). A module that opts in with
    ``pytestmark = pytest.mark.module_database`` leaves no state behind but rows: its tests run one after
    another, and each stops its pipeline before it ends.
    """
    await emptied(module_database)
    return module_database


@pytest.fixture
async def settings(database_url: str, moto: MotoServer) -> AsyncIterator[Settings]:
    """This test's settings; its broker objects are deleted afterwards."""
    test_settings = make_settings(database_url, moto.endpoint_url)
    yield test_settings
    await delete_broker_objects(test_settings)


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    """A pool on this test's database."""
    test_pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=5)
    assert test_pool is not None
    yield test_pool
    await test_pool.close()


@pytest.fixture
async def s3(settings: Settings) -> AsyncIterator[Any]:
    """An S3 client on the moto server with this test's bucket created."""
    async with open_s3_client(settings) as client:
        await ensure_bucket(client, settings.s3_bucket)
        yield client


@pytest.fixture
async def api(settings: Settings, s3: Any) -> AsyncIterator[TestClient[Any, Any]]:
    """The real API application on a local port, driven over HTTP."""
    client: TestClient[Any, Any] = TestClient(TestServer(init_app(settings)))
    await client.start_server()
    yield client
    await client.close()


@pytest.fixture
def auth(settings: Settings) -> Callable[..., dict[str, str]]:
    """``auth("u-a")`` -> headers with a bearer token for user ``u-a``; ``admin=True`` adds the scope."""

    def headers(user_id: str, *, admin: bool = False) -> dict[str, str]:
        token = mint_token(settings, user_id=user_id, scopes=["admin"] if admin else None)
        return {"Authorization": f"Bearer {token}"}

    return headers


@pytest.fixture
async def pipeline(settings: Settings, s3: Any) -> AsyncIterator[None]:
    """Relay, worker and janitor running as tasks in the test's event loop until the test ends."""
    async with running_pipeline(settings):
        yield


@pytest.fixture
async def chat(api: Any, auth: Callable[..., dict[str, str]]) -> str:
    """Conversation ``c-a`` with members ``u-a`` and ``u-b``."""
    await make_conversation(api, auth, "c-a", ["u-a", "u-b"])
    return "c-a"


@pytest.fixture(scope="session")
async def e2e_database(template_db: str) -> AsyncIterator[str]:
    """A migrated database for the end-to-end system of the session."""
    async with cloned_database(template_db, "chatexport_e2e") as url:
        yield url


@pytest.fixture(scope="session")
async def system(e2e_database: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalSystem]:
    """The compose file's services as real processes for the whole session (``local_system``), with short
    leases.
    """
    log_dir = tmp_path_factory.mktemp("e2e-logs")
    overrides = {"CHATEXPORT_LEASE_SECONDS": "10", "CHATEXPORT_HEARTBEAT_SECONDS": "2"}
    async with local_system(e2e_database, log_dir, **overrides) as local:
        yield local


@pytest.fixture
async def live_api(system: LocalSystem) -> AsyncIterator[aiohttp.ClientSession]:
    """HTTP over a real socket to the session's system's API (paths are relative to its base URL)."""
    async with aiohttp.ClientSession(base_url=system.base_url) as session:
        yield session


@pytest.fixture(scope="session")
def live_auth(system: LocalSystem) -> Callable[..., dict[str, str]]:
    """``headers_for`` the session's system: ``live_auth("alice")`` -> headers with her bearer token."""
    return headers_for(system)


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
    # Every request the page makes, for a test to read with ``driver.get_log("performance")``.
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield Browser(driver, downloads)
    finally:
        driver.quit()
