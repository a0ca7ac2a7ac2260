"""The web page's scheduled exports (docs/schedule-exports.md: On the web page) in a real browser, against the
end-to-end system: a schedule created with the form, the caller's schedules with their state and next run
(the exact time on hover), paused, resumed, and deleted with the row's buttons after a confirmation.
"""

from __future__ import annotations

import aiohttp
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from devtools.localsystem import LocalSystem
from tests.http.test_page import settle, sign_in
from tests.support import unique, wait_for
from tests.support.api_calls import Headers, make_conversation
from tests.support.e2e import Browser

pytestmark = pytest.mark.e2e

# Far ahead: no run is due while the test runs.
START_AT = "2100-01-01T00:00:00.000Z"


def cells(driver: WebDriver, schedule_id: str) -> list[str]:
    """The texts of the schedule's row; [] when the page shows no such row."""
    rows = driver.find_elements(By.CSS_SELECTOR, f'tr[data-schedule-id="{schedule_id}"]')
    return [cell.text for cell in rows[0].find_elements(By.TAG_NAME, "td")] if rows else []


def exact(driver: WebDriver, schedule_id: str, cell: str) -> str:
    """The exact value behind a cell shown in human words (its title)."""
    found = driver.find_elements(By.CSS_SELECTOR, f'tr[data-schedule-id="{schedule_id}"] td.{cell}')
    return (found[0].get_attribute("title") or "") if found else ""


def click(driver: WebDriver, schedule_id: str, button: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'tr[data-schedule-id="{schedule_id}"] button.{button}').click()


async def daily_schedule(api: aiohttp.ClientSession, auth: Headers, start_at: str) -> tuple[str, str, str]:
    """A new user's new conversation with a daily schedule from ``start_at``: (user, conversation, schedule)."""
    user, cid = unique("page-user"), unique("page-conversation")
    await make_conversation(api, auth, cid, [user])
    response = await api.post(
        f"/v3/conversations/{cid}/export-schedules",
        json={"every": "P1D", "start_at": start_at},
        headers={**auth(user), "Idempotency-Key": unique("page-schedule")},
    )
    assert response.status == 201, await response.text()
    return user, cid, (await response.json())["schedule_id"]


async def test_pause_resume_and_delete_a_schedule_in_the_browser(
    browser: Browser, system: LocalSystem, live_api: aiohttp.ClientSession, live_auth: Headers
) -> None:
    user, cid, schedule_id = await daily_schedule(live_api, live_auth, START_AT)

    driver = browser.driver
    sign_in(driver, system, live_auth, user)
    assert cells(driver, schedule_id)[:4] == [schedule_id, cid, "day", "active"]
    assert (exact(driver, schedule_id, "every"), exact(driver, schedule_id, "next-run")) == ("P1D", START_AT)

    click(driver, schedule_id, "pause")
    settle(driver).until(lambda found: cells(found, schedule_id)[3:5] == ["paused by you", "none"])
    click(driver, schedule_id, "resume")
    settle(driver).until(lambda found: cells(found, schedule_id)[3] == "active")
    assert exact(driver, schedule_id, "next-run") == START_AT
    # A delete asks first: Keep leaves the schedule as it was.
    click(driver, schedule_id, "delete")
    click(driver, schedule_id, "keep")
    settle(driver).until(lambda found: cells(found, schedule_id)[3] == "active")
    assert (await live_api.get(f"/v3/export-schedules/{schedule_id}", headers=live_auth(user))).status == 200
    click(driver, schedule_id, "delete")
    click(driver, schedule_id, "confirm-delete")
    settle(driver).until(lambda found: cells(found, schedule_id) == [])

    gone = await live_api.get(f"/v3/export-schedules/{schedule_id}", headers=live_auth(user))
    assert gone.status == 404


async def test_create_a_schedule_with_the_form(
    browser: Browser, system: LocalSystem, live_api: aiohttp.ClientSession, live_auth: Headers
) -> None:
    user, cid = unique("page-user"), unique("page-conversation")
    await make_conversation(live_api, live_auth, cid, [user])
    driver = browser.driver
    sign_in(driver, system, live_auth, user)
    driver.find_element(By.CSS_SELECTOR, f'tr[data-cid="{cid}"] button.choose-schedule').click()
    assert driver.find_element(By.ID, "schedule-conversation").get_attribute("value") == cid
    driver.find_element(By.CSS_SELECTOR, '#schedule-every option[value="P1W"]').click()
    driver.execute_script("document.getElementById('schedule-start').value = '2100-01-01T00:00:00'")
    driver.find_element(By.CSS_SELECTOR, '#schedule-format option[value="csv"]').click()
    driver.find_element(By.ID, "create-schedule").click()
    settle(driver).until(lambda found: "created" in found.find_element(By.ID, "message").text)

    schedules = (await (await live_api.get("/v3/export-schedules", headers=live_auth(user))).json())["schedules"]
    assert [
        (item["conversation_id"], item["every"], item["mode"], item["options"]["format"]) for item in schedules
    ] == [(cid, "P1W", "incremental", "csv")]
    schedule_id = schedules[0]["schedule_id"]
    assert cells(driver, schedule_id)[:4] == [schedule_id, cid, "week", "active"]
    # The browser's zone is this machine's; the API keeps the instant.
    assert exact(driver, schedule_id, "next-run") == schedules[0]["next_run_at"]


async def test_a_schedules_runs_join_the_exports(
    browser: Browser, system: LocalSystem, live_api: aiohttp.ClientSession, live_auth: Headers
) -> None:
    # Anchored in the past: its first due time has come, and the janitor creates its run at once.
    user, _, schedule_id = await daily_schedule(live_api, live_auth, "2020-01-01T00:00:00.000Z")

    async def first_run() -> str | None:
        page = await (await live_api.get(f"/v3/export-schedules/{schedule_id}/runs", headers=live_auth(user))).json()
        return page["operations"][0]["operation_id"] if page["operations"] else None

    run = await wait_for(first_run, timeout=60)
    driver = browser.driver
    sign_in(driver, system, live_auth, user)
    # A new page lists the run among the exports already; Runs brings it back after it was taken off.
    driver.execute_script(f"document.querySelector('tr[data-operation-id=\"{run}\"]').remove()")
    click(driver, schedule_id, "runs")
    settle(driver).until(lambda found: found.find_elements(By.CSS_SELECTOR, f'tr[data-operation-id="{run}"]'))
    assert "are in Your exports" in driver.find_element(By.ID, "message").text
