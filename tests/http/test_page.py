"""The web page (docs/api.md: Web page) in a real browser: Debian's chromium, headless, driven by
Selenium through /usr/bin/chromedriver, against the end-to-end system. It exports a conversation, watches
it finish live, downloads the file, and cancels another export; its files come with a strict CSP. A missing
browser fails these tests: ``.ci/run`` installs it.
"""

from __future__ import annotations

import uuid

import aiohttp
import asyncpg
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from devtools.localsystem import LocalSystem
from tests.support import unique, wait_for
from tests.support.api_calls import Headers, expected_file, import_lines, make_conversation, read_all
from tests.support.e2e import Browser

pytestmark = pytest.mark.e2e

WAIT_SECONDS = 60


def settle(driver: WebDriver) -> WebDriverWait[WebDriver]:
    """A wait that retries while the page re-renders the rows it looks at."""
    return WebDriverWait(driver, WAIT_SECONDS, ignored_exceptions=(StaleElementReferenceException,))


def sign_in(driver: WebDriver, system: LocalSystem, live_auth: Headers, user: str, *, script: str = "") -> None:
    """Open the page, run ``script`` in it first when given, and sign in as ``user``."""
    driver.get(f"{system.base_url}/ui/")
    if script:
        driver.execute_script(script)
    driver.find_element(By.ID, "token").send_keys(live_auth(user)["Authorization"].removeprefix("Bearer "))
    driver.find_element(By.ID, "use-token").click()
    settle(driver).until(lambda found: found.find_element(By.ID, "signed-in").is_displayed())


def operation_state(driver: WebDriver, operation_id: str) -> str:
    cells = driver.find_elements(By.CSS_SELECTOR, f'tr[data-operation-id="{operation_id}"] td.state')
    return cells[0].text if cells else ""


def click_in(driver: WebDriver, selector: str) -> bool:
    """Click the element of ``selector``; True, for a wait that retries while the page re-renders it."""
    driver.find_element(By.CSS_SELECTOR, selector).click()
    return True


async def insert_queued(conn: asyncpg.Connection, user: str, cid: str) -> str:
    """A QUEUED export of ``user``'s without its wake-up: nobody runs it before the janitor's requeue, long
    after the test. Returns its id.
    """
    operation_id = f"op_{uuid.uuid4().hex[:24]}"
    await conn.execute(
        "INSERT INTO operations (operation_id, owner_id, conversation_id, format, state)"
        " VALUES ($1, $2, $3, 'jsonl', 'QUEUED')",
        operation_id,
        user,
        cid,
    )
    return operation_id


async def test_the_page_is_served_with_a_strict_policy(live_api: aiohttp.ClientSession) -> None:
    for path in ("/ui/", "/ui/page.js", "/ui/page.css"):
        response = await live_api.get(path)
        assert response.status == 200, path
        assert response.headers["Content-Security-Policy"].startswith("default-src 'self'")
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    script = await (await live_api.get("/ui/page.js")).text()
    assert "innerHTML" not in script and "localStorage" not in script


async def test_export_watch_and_download_in_the_browser(
    browser: Browser, system: LocalSystem, live_api: aiohttp.ClientSession, live_auth: Headers
) -> None:
    user, cid = unique("page-user"), unique("page-conversation")
    await make_conversation(live_api, live_auth, cid, [user])
    lines = [{"message_id": f"m{n}", "sender_id": user, "body": f"<b>{n}</b> & more"} for n in range(30)]
    await import_lines(live_api, live_auth, cid, lines)
    content = expected_file(await read_all(live_api, live_auth, user, cid))

    driver = browser.driver
    sign_in(driver, system, live_auth, user)
    row = driver.find_element(By.CSS_SELECTOR, f'tr[data-cid="{cid}"]')
    row.find_element(By.CSS_SELECTOR, "button.export").click()
    settle(driver).until(
        lambda found: "SUCCEEDED" in [cell.text for cell in found.find_elements(By.CSS_SELECTOR, "td.state")]
    )
    done = driver.find_element(By.XPATH, "//td[@class='state' and text()='SUCCEEDED']/..")
    operation_id = done.get_attribute("data-operation-id")
    # The stream has ended with SUCCEEDED: the row is drawn for the last time.
    done.find_element(By.CSS_SELECTOR, "button.download").click()

    operation = await (await live_api.get(f"/v3/operations/{operation_id}", headers=live_auth(user))).json()
    # The name the download's Content-Disposition gives (docs/api.md: Downloads, Download).
    saved = browser.downloads / f"{cid}-{operation['created_at'][:10]}.jsonl"
    await wait_for(saved.exists, timeout=WAIT_SECONDS)
    assert saved.read_bytes() == content


async def test_cancel_in_the_browser(
    browser: Browser, system: LocalSystem, live_api: aiohttp.ClientSession, live_auth: Headers
) -> None:
    user, cid = unique("page-user"), unique("page-conversation")
    await make_conversation(live_api, live_auth, cid, [user])
    conn = await asyncpg.connect(system.settings().database_url)
    try:
        operation_id = await insert_queued(conn, user, cid)
    finally:
        await conn.close()

    driver = browser.driver
    sign_in(driver, system, live_auth, user)
    # The list is fetched after the sign-in shows, and re-rendered as it changes: wait for the row, and click in
    # a wait that retries a row replaced meanwhile.
    settle(driver).until(lambda found: operation_state(found, operation_id) == "QUEUED")
    settle(driver).until(lambda found: click_in(found, f'tr[data-operation-id="{operation_id}"] button.cancel'))
    settle(driver).until(lambda found: operation_state(found, operation_id) in ("CANCEL_REQUESTED", "CANCELED"))


# Refuses the page's event streams, so that it falls back to polling, and records every poll's
# If-None-Match and status.
_NO_STREAM = """
const original = window.fetch;
window.polls = [];
window.fetch = async (path, init) => {
  if (String(path).endsWith("/events")) throw new TypeError("no stream");
  const response = await original(path, init);
  if (String(path).startsWith("/v3/operations/op_")) {
    window.polls.push([(init.headers || {})["If-None-Match"] || null, response.status]);
  }
  return response;
};
"""


async def test_without_a_stream_the_page_polls_with_the_version_it_shows(
    browser: Browser, system: LocalSystem, live_api: aiohttp.ClientSession, live_auth: Headers
) -> None:
    user, cid = unique("page-user"), unique("page-conversation")
    await make_conversation(live_api, live_auth, cid, [user])
    conn = await asyncpg.connect(system.settings().database_url)
    try:
        operation_id = await insert_queued(conn, user, cid)
        driver = browser.driver
        sign_in(driver, system, live_auth, user, script=_NO_STREAM)
        settle(driver).until(lambda found: [None, 200] in found.execute_script("return window.polls"))
        settle(driver).until(
            lambda found: any(sent and status == 304 for sent, status in found.execute_script("return window.polls"))
        )
        await conn.execute("UPDATE operations SET state = 'RUNNING' WHERE operation_id = $1", operation_id)
        settle(driver).until(lambda found: operation_state(found, operation_id) == "RUNNING")
    finally:
        await conn.close()


async def test_a_refused_token_asks_for_a_new_one_and_the_export_goes_on(
    browser: Browser, system: LocalSystem, live_api: aiohttp.ClientSession, live_auth: Headers
) -> None:
    user, cid = unique("page-user"), unique("page-conversation")
    await make_conversation(live_api, live_auth, cid, [user])
    await import_lines(live_api, live_auth, cid, [{"message_id": "m1", "sender_id": user, "body": "hello"}])
    driver = browser.driver
    sign_in(driver, system, live_auth, user)
    # The token the page holds is refused from now on, as an expired one or one of a rotated key would be.
    driver.execute_script("token = 'refused.token.value';")

    driver.find_element(By.CSS_SELECTOR, f'tr[data-cid="{cid}"] button.export').click()
    settle(driver).until(lambda found: "token was refused" in found.find_element(By.ID, "message").text)
    assert driver.find_element(By.ID, "signed-in").is_displayed()  # what the user was doing stays on the page
    assert (await (await live_api.get("/v3/operations", headers=live_auth(user))).json())["operations"] == []

    driver.find_element(By.ID, "token").send_keys(live_auth(user)["Authorization"].removeprefix("Bearer "))
    driver.find_element(By.ID, "use-token").click()
    settle(driver).until(
        lambda found: "SUCCEEDED" in [cell.text for cell in found.find_elements(By.CSS_SELECTOR, "td.state")]
    )
    operations = (await (await live_api.get("/v3/operations", headers=live_auth(user))).json())["operations"]
    assert [operation["conversation_id"] for operation in operations] == [cid]
