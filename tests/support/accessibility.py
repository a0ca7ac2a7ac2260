"""The page checked with axe-core (``tests/vendor/axe-core``) in the test's browser: the WCAG 2.1 A and AA rules,
with every violation a failure and the ``incomplete`` results (what axe could not decide) printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from selenium.webdriver.remote.webdriver import WebDriver

AXE = Path(__file__).resolve().parents[1] / "vendor" / "axe-core" / "axe.min.js"
WCAG_21_A_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
_RUN = """
const done = arguments[arguments.length - 1];
axe.run(document, {runOnly: {type: "tag", values: arguments[0]}, resultTypes: ["violations", "incomplete"]})
  .then((results) => done({violations: results.violations, incomplete: results.incomplete}))
  .catch((error) => done({error: String(error)}));
"""


def axe_results(driver: WebDriver) -> dict[str, Any]:
    """Run axe-core on the page as it is now; return ``{"violations": [...], "incomplete": [...]}``. Raises
    ``AssertionError`` when axe itself fails."""
    if not driver.execute_script("return typeof window.axe !== 'undefined'"):
        driver.execute_script(AXE.read_text(encoding="utf-8"))
    results: dict[str, Any] = driver.execute_async_script(_RUN, WCAG_21_A_AA)
    assert "error" not in results, results
    return results


def check_accessible(driver: WebDriver, state: str) -> None:
    """Fail with every WCAG 2.1 A or AA violation axe finds on the page in ``state`` (words for the output);
    print what it could not decide."""
    results = axe_results(driver)
    for item in results["incomplete"]:
        targets = [node["target"] for node in item["nodes"]]
        print(f"axe, {state}: could not decide {item['id']} ({item['help']}) on {targets}")
    violations = [
        f"{item['id']} ({item['impact']}): {item['help']} on {[node['target'] for node in item['nodes']]}"
        for item in results["violations"]
    ]
    assert not violations, f"{state}: " + "; ".join(violations)
