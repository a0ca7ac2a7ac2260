"""The documentation's pictures of the web page, made from a running system (``make screenshots``), never by hand.

It starts the whole system as local processes (``devtools.localsystem``) on a database of its own on the local
PostgreSQL, loads the English demo conversations, and drives Debian's headless chromium with Selenium as a user
would: signs in as ``alice``, finds a conversation with the search box, exports it, waits for the file. Then it
writes ``docs/page.png`` (the page at 1200 px) and ``docs/page-narrow.png`` (360 px wide), and removes the
database and the system's broker objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from pathlib import Path

import asyncpg
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from devtools.broker import delete_broker_objects
from devtools.localsystem import LocalSystem
from devtools.prerequisites import CHROMEDRIVER, CHROMIUM
from shared.auth import mint_token
from shared.settings import Settings

DOCS = Path(__file__).resolve().parents[1] / "docs"
# The servers the settings' defaults name: the local PostgreSQL (a database of its own here) and RabbitMQ.
SERVER = str(Settings.model_fields["database_url"].default).rsplit("/", 1)[0]
AMQP_URL = str(Settings.model_fields["amqp_url"].default)
USER = "alice"
SEARCH = "greetings"
CONVERSATION = "corpus-english-greetings"
WAIT_SECONDS = 60
WIDE, NARROW = (1200, 900), (360, 1400)


def browser() -> webdriver.Chrome:
    """Headless chromium through Debian's chromedriver (never a downloaded one)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--hide-scrollbars"):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))


def photograph(system: LocalSystem) -> list[Path]:
    """Drive the page through one export and save the pictures; return their paths."""
    token = mint_token(system.settings(), user_id=USER)
    driver = browser()
    try:
        driver.set_window_size(*WIDE)
        wait = WebDriverWait(driver, WAIT_SECONDS)
        driver.get(f"{system.base_url}/ui/")
        driver.find_element(By.ID, "token").send_keys(token)
        driver.find_element(By.ID, "use-token").click()
        wait.until(lambda found: found.find_element(By.ID, "signed-in").is_displayed())
        driver.find_element(By.ID, "conversation-search").send_keys(SEARCH)
        row = f'tr[data-cid="{CONVERSATION}"]'
        wait.until(lambda found: len(found.find_elements(By.CSS_SELECTOR, "tr[data-cid]")) == 1)
        driver.find_element(By.CSS_SELECTOR, f"{row} button.export").click()
        wait.until(lambda found: found.find_elements(By.CSS_SELECTOR, "#operations tr[data-state=SUCCEEDED]"))
        driver.execute_script("window.scrollTo(0, 0)")
        pictures = [DOCS / "page.png", DOCS / "page-narrow.png"]
        driver.save_screenshot(str(pictures[0]))
        driver.set_window_size(*NARROW)
        driver.save_screenshot(str(pictures[1]))
        return pictures
    finally:
        driver.quit()


async def main() -> None:
    """Run the system, take the pictures, clean up."""
    name = f"chatexport_screens_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(f"{SERVER}/postgres")
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    system = LocalSystem(
        database_url=f"{SERVER}/{name}",
        amqp_url=AMQP_URL,
        log_dir=Path(tempfile.mkdtemp(prefix="chatexport-screenshots-")),
        overrides={"CHATEXPORT_ENVIRONMENT": "development"},
    )
    try:
        system.start(workers=1, janitors=1)
        system.run_cli("import", "--language", "english")
        for picture in await asyncio.to_thread(photograph, system):
            print(f"wrote {picture.relative_to(DOCS.parent)}")
    finally:
        system.stop()
        with contextlib.suppress(Exception):
            await delete_broker_objects(system.settings())
        admin = await asyncpg.connect(f"{SERVER}/postgres")
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
