"""The web page's scheduled exports (docs/schedule-exports.md: On the web page) in a real browser, against the
end-to-end system: the caller's schedules with their state and next run, paused, resumed and deleted with
the row's buttons.
"""

from __future__ import annotations

import aiohttp
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from devtools.localsystem import LocalSystem
from tests.http.test_page import settle, sign_in
from tests.support import unique
from tests.support.api_calls import Headers, make_conversation
from tests.support.e2e import Browser

pytestmark = pytest.mark.e2e

# Far ahead: no run is due while the test runs.
START_AT = "2100-01-01T00:00:00.000Z"


def cells(driver: WebDriver, schedule_id: str) -> list[str]:
    """The texts of the schedule's row; [] when the page shows no such row."""
    rows = driver.find_elements(By.CSS_SELECTOR, f'tr[data-schedule-id="{schedule_id}"]')
    return [cell.text for cell in rows[0].find_elements(By.TAG_NAME, "td")] if rows else []


def click(driver: WebDriver, schedule_id: str, button: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'tr[data-schedule-id="{schedule_id}"] button.{button}').click()


async def test_pause_resume_and_delete_a_schedule_in_the_browser(
    browser: Browser, system: LocalSystem, live_api: aiohttp.ClientSession, live_auth: Headers
) -> None:
    user, cid = unique("page-user"), unique("page-conversation")
    await make_conversation(live_api, live_auth, cid, [user])
    response = await live_api.post(
        f"/v3/conversations/{cid}/export-schedules",
        json={"every": "P1D", "start_at": START_AT},
        headers={**live_auth(user), "Idempotency-Key": unique("page-schedule")},
    )
    assert response.status == 201, await response.text()
    schedule_id = (await response.json())["schedule_id"]

    driver = browser.driver
    sign_in(driver, system, live_auth, user)
    assert cells(driver, schedule_id)[:5] == [schedule_id, cid, "P1D", "ACTIVE", START_AT]

    click(driver, schedule_id, "pause")
    settle(driver).until(lambda found: cells(found, schedule_id)[3:5] == ["PAUSED (USER)", "none"])
    click(driver, schedule_id, "resume")
    settle(driver).until(lambda found: cells(found, schedule_id)[3:5] == ["ACTIVE", START_AT])
    click(driver, schedule_id, "delete")
    settle(driver).until(lambda found: cells(found, schedule_id) == [])

    gone = await live_api.get(f"/v3/export-schedules/{schedule_id}", headers=live_auth(user))
    assert gone.status == 404
