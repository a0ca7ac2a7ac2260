"""The interactive API reference at ``/v3/docs`` (``services.api.views.docs``): its files, their content types
and their Content-Security-Policy in process, and, in Debian's headless chromium against the end-to-end system
(as ``test_page.py`` drives it), Swagger UI rendering the API's own OpenAPI document without breaking that
policy, and calling the API with a token.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin

from aiohttp.test_utils import TestClient
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from devtools.localsystem import LocalSystem
from services.api.views.docs import CONTENT_SECURITY_POLICY, CONTENTS, FILES
from shared.routes import ROUTES, ROUTES_BY_NAME, path
from tests.support import unique
from tests.support.api_calls import Headers
from tests.support.e2e import Browser

WAIT_SECONDS = 60
DOCS = path("docsPage")
MEDIA_TYPES = {
    "docsPage": "text/html",
    "docsScript": "text/javascript",
    "docsSwaggerScript": "text/javascript",
    "docsSwaggerStyle": "text/css",
}
# Runs before any script of the page (a DevTools script is not under the page's policy): every violation of the
# policy is kept for the test to read.
RECORD_VIOLATIONS = """
window.policyViolations = [];
document.addEventListener("securitypolicyviolation", (event) => window.policyViolations.push(
  {directive: event.effectiveDirective, blocked: event.blockedURI, source: event.sourceFile}));
"""


class _References(HTMLParser):
    """The ``src`` of every script and the ``href`` of every style sheet of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "script" and attributes.get("src"):
            self.found.append(str(attributes["src"]))
        if tag == "link" and attributes.get("rel") == "stylesheet" and attributes.get("href"):
            self.found.append(str(attributes["href"]))


def test_the_page_names_exactly_the_files_the_routes_serve() -> None:
    references = _References()
    references.feed(CONTENTS["docsPage"][0].decode())
    served = {route.path for route in ROUTES if route.name in FILES and route.name != "docsPage"}
    assert {urljoin(f"http://api{DOCS}", found).removeprefix("http://api") for found in references.found} == served
    assert set(FILES) == {route.name for route in ROUTES if route.path == DOCS or route.path.startswith(f"{DOCS}/")}
    assert set(FILES) == set(MEDIA_TYPES)
    assert all(ROUTES_BY_NAME[name].public and ROUTES_BY_NAME[name].page for name in FILES)


def test_the_policy_allows_no_inline_script_eval_or_other_origin() -> None:
    directives = dict(directive.strip().split(" ", 1) for directive in CONTENT_SECURITY_POLICY.split(";"))
    assert directives["default-src"] == "'self'" and directives["script-src"] == "'self'"
    assert "style-src" not in directives
    sources = " ".join(directives.values())
    assert "unsafe-" not in sources and not re.search(r"https?:|\*", sources)


async def test_the_page_and_its_files_are_served_without_a_token(api: TestClient[Any, Any]) -> None:
    for name, media_type in MEDIA_TYPES.items():
        response = await api.get(path(name))
        assert response.status == 200, name
        assert response.content_type == media_type, name
        assert response.charset == "utf-8", name
        assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert await response.read() == CONTENTS[name][0]
    script = await (await api.get(path("docsScript"))).text()
    assert "innerHTML" not in script and "localStorage" not in script


async def test_only_the_listed_files_are_served(api: TestClient[Any, Any], auth: Headers) -> None:
    headers = auth(unique("docs-user"))
    unknown = ("swagger-ui.js", "swagger-ui-standalone-preset.js", "index.html", "..%2F..%2Fopenapi.json", "")
    for name in unknown:
        # Like any path under /v3 that is not a public route's: 401 without a token, and 404 with one.
        assert (await api.get(f"{DOCS}/{name}")).status == 401, name
        assert (await api.get(f"{DOCS}/{name}", headers=headers)).status == 404, name


def settle(driver: WebDriver) -> WebDriverWait[WebDriver]:
    """A wait that retries while Swagger UI re-renders what it looks at."""
    return WebDriverWait(driver, WAIT_SECONDS, ignored_exceptions=(StaleElementReferenceException,))


def violations(driver: WebDriver) -> list[dict[str, str]]:
    found: list[dict[str, str]] = driver.execute_script("return window.policyViolations")
    return found


def operation(driver: WebDriver, method: str, route_path: str) -> list[Any]:
    """The rendered operation block of ``method`` on ``route_path`` (empty until Swagger UI has drawn it)."""
    selector = f'.opblock-{method.lower()} .opblock-summary-path[data-path="{route_path}"]'
    return driver.find_elements(By.CSS_SELECTOR, selector)


async def test_the_reference_renders_the_export_routes_in_the_browser(
    browser: Browser, system: LocalSystem, live_auth: Headers
) -> None:
    driver = browser.driver
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_VIOLATIONS})
    driver.get(f"{system.base_url}{DOCS}")
    submit = ROUTES_BY_NAME["submitExport"]
    settle(driver).until(lambda found: operation(found, submit.method, submit.path))
    for name in ("downloadResult", "getOperation", "cancelOperation"):
        route = ROUTES_BY_NAME[name]
        assert operation(driver, route.method, route.path), name
    assert not operation(driver, "get", DOCS)
    assert violations(driver) == []

    # With a token typed into "Authorize", "Try it out" calls the API from the page's origin.
    driver.find_element(By.CSS_SELECTOR, ".scheme-container .btn.authorize").click()
    token = live_auth(unique("docs-user"))["Authorization"].removeprefix("Bearer ")
    settle(driver).until(lambda found: found.find_elements(By.CSS_SELECTOR, ".auth-container input"))
    driver.find_element(By.CSS_SELECTOR, ".auth-container input").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, ".auth-container .btn.modal-btn.authorize").click()
    driver.find_element(By.CSS_SELECTOR, ".auth-btn-wrapper .btn-done").click()
    listing = ROUTES_BY_NAME["listOperations"]
    operation(driver, listing.method, listing.path)[0].click()
    block = f"#operations-operations-{listing.name}"
    settle(driver).until(lambda found: found.find_elements(By.CSS_SELECTOR, f"{block} .try-out__btn"))
    driver.find_element(By.CSS_SELECTOR, f"{block} .try-out__btn").click()
    settle(driver).until(lambda found: found.find_elements(By.CSS_SELECTOR, f"{block} .btn.execute"))
    driver.find_element(By.CSS_SELECTOR, f"{block} .btn.execute").click()
    status = f"{block} .live-responses-table .response .response-col_status"
    settle(driver).until(lambda found: found.find_elements(By.CSS_SELECTOR, status))
    assert driver.find_element(By.CSS_SELECTOR, status).text.strip() == "200"
    assert violations(driver) == []
