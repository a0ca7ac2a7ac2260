"""The web page waits as the API's rate limits ask (docs/api.md: Rate limits; Web page): a 429's ``Retry-After`` and
a ``RateLimit`` field that shows a policy spent hold its next poll back, with jitter on top and never less. In a
real browser (Debian's chromium, as in ``tests/http/test_page.py``) on the page's own files, with its ``fetch``
and timers stood in for: no API is needed, and no wait takes any time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e import Browser

# A browser is a real process: not for `make test-quick`.
pytestmark = pytest.mark.e2e

PAGE = Path(__file__).resolve().parents[2] / "services" / "api" / "page" / "index.html"
JITTER = 1.25

# The page polls op_1 against the answers given ([status, body, fields] each) instead of the API's, and each of
# its waits ends at once; the script returns the waits, in seconds.
POLL = """
const [answers, finished] = [arguments[0], arguments[arguments.length - 1]];
const waits = [];
window.fetch = async () => {
  const [status, body, headers] = answers.shift();
  return new Response(JSON.stringify(body), { status, headers });
};
window.setTimeout = (resolve, ms) => { waits.push(ms / 1000); resolve(); return 0; };
watched.set("op_1", true);  // the row poll() shows starts no watch of its own
token = "token";
poll("op_1").then(() => finished(waits), (error) => finished(String(error)));
"""


def representation(state: str, *, done: bool) -> dict[str, Any]:
    return {
        "operation_id": "op_1",
        "state": state,
        "done": done,
        "conversation_id": "c1",
        "created_at": "2026-12-01T10:00:00.000Z",
        "request": {"format": "jsonl"},
        "progress": {"phase": "writing", "messages_written": 1, "bytes_written": 10},
        **({} if done else {"next_poll_after_seconds": 2}),
    }


def test_a_429_and_a_spent_policy_hold_the_next_poll_back(browser: Browser) -> None:
    refused = {"code": "RATE_LIMITED", "detail": "Too many polls.", "violated-policies": ["polls"]}
    answers = [
        [429, refused, {"Retry-After": "20", "Content-Type": "application/problem+json"}],
        [200, representation("RUNNING", done=False), {"RateLimit": '"polls";r=0;t=40;pk=:AAAA:', "ETag": '"1"'}],
        [200, representation("RUNNING", done=False), {"RateLimit": '"polls";r=5;t=40;pk=:AAAA:', "ETag": '"2"'}],
        [200, representation("CANCELLED", done=True), {}],
    ]
    driver = browser.driver
    driver.get(PAGE.as_uri())
    after_429, after_spent, after_renewed = driver.execute_async_script(POLL, answers)
    assert 20 <= after_429 <= 20 * JITTER
    # t, not the operation's next_poll_after_seconds of 2.
    assert 40 <= after_spent <= 40 * JITTER
    assert after_renewed == 2
