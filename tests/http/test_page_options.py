"""The web page's export options, search, keyboard use and accessibility (docs/api.md: Web page) in a real browser
against the end-to-end system: an export in every format with a time range and gzip, downloaded and checked
against the same request made through the API; the search narrowing the conversations; an export started and
downloaded with the keyboard alone; a bad option shown beside its field; and axe-core's WCAG 2.1 A and AA
rules on every state of the page.
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

from devtools.localsystem import LocalSystem
from tests.http.test_page import WAIT_SECONDS, click_in, operation_state, settle, sign_in
from tests.support import unique, wait_for
from tests.support.accessibility import check_accessible
from tests.support.api_calls import Headers, import_lines, make_conversation, submit, wait_terminal
from tests.support.e2e import Browser

pytestmark = pytest.mark.e2e

FORMATS = ("jsonl", "csv", "html", "txt")
# Messages one a second from 08:00:00Z; the range keeps 08:00:10 to 08:00:19 (the browser's zone is UTC here,
# and the page sends its offset, so the range means the same instants anywhere).
MESSAGES = 30
SINCE, UNTIL = "2026-11-30T08:00:10", "2026-11-30T08:00:20"


def set_value(driver: WebDriver, element_id: str, value: str) -> None:
    """Set a form field as a user would leave it (date inputs take no typed text portably)."""
    driver.execute_script(
        "const f = document.getElementById(arguments[0]); f.value = arguments[1];"
        " f.dispatchEvent(new Event('input', {bubbles: true}));",
        element_id,
        value,
    )


def newest_operation(driver: WebDriver) -> str:
    rows = driver.find_elements(By.CSS_SELECTOR, "#operations tbody tr[data-operation-id]")
    return rows[0].get_attribute("data-operation-id") or "" if rows else ""


async def conversation_with_messages(api: aiohttp.ClientSession, auth: Headers, user: str) -> str:
    cid = unique("page-options")
    await make_conversation(api, auth, cid, [user])
    lines = [
        {"message_id": f"m{n}", "sender_id": user, "body": f"line {n}", "sent_at": f"2026-11-30T08:00:{n:02d}.000Z"}
        for n in range(MESSAGES)
    ]
    await import_lines(api, auth, cid, lines)
    return cid


async def same_request_through_the_api(
    api: aiohttp.ClientSession, auth: Headers, user: str, cid: str, body: dict[str, Any]
) -> bytes:
    """The decompressed file the API makes for ``body``."""
    response = await submit(api, auth, user, cid, body, unique("api-twin"))
    assert response.status == 202, await response.text()
    operation = await wait_terminal(api, auth, user, response.headers["Location"], timeout=WAIT_SECONDS)
    assert operation["state"] == "SUCCEEDED", operation
    file = await api.get(operation["result"]["url"], headers=auth(user))
    return gzip.decompress(await file.read())


async def test_an_export_in_every_format_with_a_time_range_and_gzip(
    browser: Browser, system: LocalSystem, live_api: aiohttp.ClientSession, live_auth: Headers
) -> None:
    user = unique("page-user")
    cid = await conversation_with_messages(live_api, live_auth, user)
    driver = browser.driver
    sign_in(driver, system, live_auth, user)
    set_value(driver, "export-conversation", cid)
    set_value(driver, "export-since", SINCE)
    set_value(driver, "export-until", UNTIL)
    driver.find_element(By.ID, "export-gzip").click()
    for name in FORMATS:
        operation_id = start_and_download(driver, name)
        operation = await (await live_api.get(f"/v3/operations/{operation_id}", headers=live_auth(user))).json()
        assert operation["request"]["compression"] == "gzip"

        def downloaded(fmt: str = name) -> Path | None:
            found = list(browser.downloads.glob(f"{cid}-*.{fmt}.gz"))
            return found[0] if found else None

        saved = await wait_for(downloaded, timeout=WAIT_SECONDS)
        content = saved.read_bytes()
        assert hashlib.sha256(content).hexdigest() == operation["result"]["sha256"]
        twin = {"format": name, "since": SINCE + "Z", "until": UNTIL + "Z", "compression": "gzip"}
        assert gzip.decompress(content) == await same_request_through_the_api(live_api, live_auth, user, cid, twin)
        assert operation["result"]["message_count"] == 10
        saved.unlink()


def start_and_download(driver: WebDriver, name: str) -> str:
    """Choose format ``name``, start the export with the form, wait for it and press its Download; return its id."""
    driver.find_element(By.CSS_SELECTOR, f'#export-format option[value="{name}"]').click()
    started = newest_operation(driver)
    driver.find_element(By.ID, "start-export").click()
    settle(driver).until(lambda found: newest_operation(found) not in ("", started))
    operation_id = newest_operation(driver)
    settle(driver).until(lambda found: operation_state(found, operation_id) == "SUCCEEDED")
    settle(driver).until(lambda found: click_in(found, f'tr[data-operation-id="{operation_id}"] button.download'))
    return operation_id


async def test_the_search_narrows_the_conversations(
    browser: Browser, system: LocalSystem, live_api: aiohttp.ClientSession, live_auth: Headers
) -> None:
    user = unique("page-user")
    tag = unique("find")
    wanted = [f"{tag}-alpha", f"{tag}-ALPHA-2"]
    for cid in [*wanted, f"{tag}-beta", unique("other")]:
        await make_conversation(live_api, live_auth, cid, [user])
    driver = browser.driver
    sign_in(driver, system, live_auth, user)
    assert len(listed(driver)) == 4
    driver.find_element(By.ID, "conversation-search").send_keys("Alpha")
    settle(driver).until(lambda found: sorted(listed(found)) == sorted(wanted))


def listed(driver: WebDriver) -> list[str]:
    return [row.get_attribute("data-cid") or "" for row in driver.find_elements(By.CSS_SELECTOR, "tr[data-cid]")]


async def test_a_bad_option_is_shown_beside_its_field_and_the_page_stays_accessible(
    browser: Browser, system: LocalSystem, live_api: aiohttp.ClientSession, live_auth: Headers
) -> None:
    user = unique("page-user")
    cid = await conversation_with_messages(live_api, live_auth, user)
    driver = browser.driver
    driver.get(f"{system.base_url}/ui/")
    check_accessible(driver, "signed out")
    sign_in(driver, system, live_auth, user)
    check_accessible(driver, "signed in")

    set_value(driver, "export-conversation", cid)
    set_value(driver, "export-notify", "http://127.0.0.1/not-allowed")
    driver.find_element(By.ID, "start-export").click()
    error = driver.find_element(By.ID, "export-notify-error")
    settle(driver).until(lambda found: error.text != "")
    assert driver.find_element(By.ID, "export-notify").get_attribute("aria-invalid") == "true"
    assert "VALIDATION_FAILED" in driver.find_element(By.ID, "message").text or error.text
    check_accessible(driver, "an error shown")

    set_value(driver, "export-notify", "")
    driver.find_element(By.ID, "start-export").click()
    settle(driver).until(lambda found: newest_operation(found) != "")
    check_accessible(driver, "an export shown")
    # 360 CSS pixels wide: nothing is cut off; the tables scroll in their own box.
    driver.set_window_size(360, 800)
    assert driver.execute_script("return document.documentElement.scrollWidth") <= 360
    check_accessible(driver, "360 px wide")


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"export-senders": "alice bob"}, "export-senders", "separate several with commas"),
        ({"export-split": "1"}, "export-split", "At least 5 MiB"),
        ({"export-since": SINCE, "export-until": SINCE}, "export-until", "Until must be later than From"),
        ({"export-conversation": "no-such-conversation"}, "export-conversation", "You are not a member"),
    ],
)
async def test_what_a_user_gets_wrong_is_said_beside_the_field_in_words(
    browser: Browser,
    system: LocalSystem,
    live_api: aiohttp.ClientSession,
    live_auth: Headers,
    fields: dict[str, str],
    field: str,
    words: str,
) -> None:
    user = unique("page-user")
    cid = await conversation_with_messages(live_api, live_auth, user)
    driver = browser.driver
    sign_in(driver, system, live_auth, user)
    set_value(driver, "export-conversation", cid)
    for name, value in fields.items():
        set_value(driver, name, value)
    driver.find_element(By.ID, "start-export").click()
    settle(driver).until(lambda found: words in found.find_element(By.ID, f"{field}-error").text)
    assert driver.find_element(By.ID, field).get_attribute("aria-invalid") == "true"
    operations = (await (await live_api.get("/v3/operations", headers=live_auth(user))).json())["operations"]
    assert operations == []  # nothing was started


def focused(driver: WebDriver) -> WebElement:
    return driver.switch_to.active_element


def tab_to(driver: WebDriver, element_id: str, *, limit: int = 60) -> None:
    """Press Tab until the element ``element_id`` has the focus; fail after ``limit`` presses."""
    for _ in range(limit):
        if focused(driver).get_attribute("id") == element_id:
            return
        focused(driver).send_keys(Keys.TAB)
    raise AssertionError(f"#{element_id} is not reached with Tab")


async def test_an_export_with_the_keyboard_alone(
    browser: Browser, system: LocalSystem, live_api: aiohttp.ClientSession, live_auth: Headers
) -> None:
    user = unique("page-user")
    cid = await conversation_with_messages(live_api, live_auth, user)
    driver = browser.driver
    driver.get(f"{system.base_url}/ui/")
    driver.find_element(By.TAG_NAME, "body").send_keys(Keys.TAB)
    tab_to(driver, "token")
    focused(driver).send_keys(live_auth(user)["Authorization"].removeprefix("Bearer "))
    focused(driver).send_keys(Keys.TAB)
    focused(driver).send_keys(Keys.ENTER)  # Use token
    settle(driver).until(lambda found: found.find_element(By.ID, "signed-in").is_displayed())
    tab_to(driver, "export-conversation")
    focused(driver).send_keys(cid)
    focused(driver).send_keys(Keys.ENTER)  # submits the form
    settle(driver).until(lambda found: newest_operation(found) != "")
    operation_id = newest_operation(driver)
    settle(driver).until(lambda found: operation_state(found, operation_id) == "SUCCEEDED")
    # The row's Download button is reached with Tab and pressed with Enter.
    download = f'tr[data-operation-id="{operation_id}"] button.download'
    settle(driver).until(lambda found: found.find_element(By.CSS_SELECTOR, download))
    for _ in range(80):
        if focused(driver).get_attribute("aria-label") == f"Download export {operation_id}":
            break
        focused(driver).send_keys(Keys.SHIFT, Keys.TAB)
    else:
        raise AssertionError("the Download button is not reached with the keyboard")
    focused(driver).send_keys(Keys.ENTER)
    saved = await wait_for(lambda: next(iter(browser.downloads.glob(f"{cid}-*.jsonl")), None), timeout=WAIT_SECONDS)
    assert saved.read_bytes().count(b"\n") == MESSAGES
