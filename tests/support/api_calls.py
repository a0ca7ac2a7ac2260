"""HTTP helpers shared by the integration and end-to-end tests. ``api`` is anything with aiohttp's
client methods: the integration tests' ``TestClient`` or a ``ClientSession`` with a ``base_url``.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from services.janitor.main import serve as serve_janitor
from services.relay.main import serve as serve_relay
from services.worker.main import serve as serve_worker
from shared import jsontext
from shared.export.formats import FORMAT_NAMES
from shared.settings import Settings
from shared.webhooks.signing import signature
from tests.support import wait_for

Headers = Callable[..., dict[str, str]]

PROBLEM_TYPE = "application/problem+json"
# The members every problem has (RFC 9457; docs/api.md: Error codes).
PROBLEM_MEMBERS = {"type", "title", "status", "detail", "code"}


async def make_conversation(api: Any, auth: Headers, cid: str, members: list[str]) -> None:
    response = await api.put(f"/admin/conversations/{cid}", json={"members": members}, headers=auth("root", admin=True))
    assert response.status in (200, 204), await response.text()


async def import_lines(api: Any, auth: Headers, cid: str, lines: list[dict[str, Any]]) -> None:
    body = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()
    response = await api.post(
        f"/admin/conversations/{cid}/messages:import",
        data=body,
        headers={**auth("root", admin=True), "Content-Type": "application/x-ndjson"},
    )
    assert response.status == 200, await response.text()


async def read_all(api: Any, auth: Headers, user: str, cid: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        response = await api.get(
            f"/v2/conversations/{cid}/messages", params={"after_seq": after, "limit": 1000}, headers=auth(user)
        )
        assert response.status == 200
        page = await response.json()
        messages += page["messages"]
        after = page["next_after_seq"]
    return messages


async def submit(api: Any, auth: Headers, user: str, cid: str, body: dict[str, Any], key: str) -> Any:
    return await api.post(f"/v3/conversations/{cid}/exports", json=body, headers={**auth(user), "Idempotency-Key": key})


async def wait_terminal(api: Any, auth: Headers, user: str, location: str, *, timeout: float = 30) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        response = await api.get(location, headers=auth(user))
        body: dict[str, Any] = await response.json()
        return body if "next_poll_after_seconds" not in body else None

    result: dict[str, Any] = await wait_for(ended, timeout=timeout)
    return result


async def succeeded(
    api: Any, auth: Headers, user: str, cid: str, body: dict[str, Any], key: str, *, timeout: float = 60
) -> dict[str, Any]:
    """``user``'s export of ``cid`` with ``body`` under ``key``, waited for until it ends SUCCEEDED (asserted)."""
    response = await submit(api, auth, user, cid, body, key)
    assert response.status == 202, await response.text()
    operation = await wait_terminal(api, auth, user, response.headers["Location"], timeout=timeout)
    assert operation["state"] == "SUCCEEDED", operation
    return operation


async def every_format(api: Any, auth: Headers, user: str, cid: str) -> dict[str, bytes]:
    """``user``'s export of ``cid`` in each format, waited for: each file's bytes by format name."""
    files = {}
    for kind in FORMAT_NAMES:
        operation = await succeeded(api, auth, user, cid, {"format": kind}, f"k-every-{kind}")
        response = await api.get(operation["result"]["url"], headers=auth(user))
        assert response.status == 200, await response.text()
        files[kind] = await response.read()
    return files


def verified_callback(secret: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """The JSON of a completion callback, once one of its ``webhook-signature`` signatures checks out with
    ``secret`` (``whsec_...``, as ``GET /v3/webhooks/secret`` gives it).
    """
    expected = signature(
        base64.b64decode(secret.removeprefix("whsec_")),
        webhook_id=headers["webhook-id"],
        timestamp=int(headers["webhook-timestamp"]),
        body=body,
    )
    assert expected in headers["webhook-signature"].split(" ")
    message: dict[str, Any] = json.loads(body)
    return message


def expected_file(messages: list[dict[str, Any]]) -> bytes:
    """The export file of ``messages`` as the read API gave them (docs/api.md: Submitting an export, The file)."""
    return b"".join(jsontext.dumps(message, separators=(",", ":")).encode() + b"\n" for message in messages)


@asynccontextmanager
async def running_pipeline(settings: Settings) -> AsyncIterator[None]:
    """Relay, worker and janitor as tasks for the duration of the block (what the ``pipeline`` fixture runs for
    a whole test; a test may instead start it once it has arranged the state the worker must find).
    """
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(serve(settings, stop=stop), name=serve.__module__)
        for serve in (serve_relay, serve_worker, serve_janitor)
    ]
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)


async def expect_problem(response: Any, status: int, code: str, *, case: object = None) -> dict[str, Any]:
    """Assert that ``response`` (an aiohttp client response) is an RFC 9457 problem with ``status`` and
    ``code``; return its body. ``case`` labels failures.
    """
    text = await response.text()
    return check_problem(response.status, response.headers.get("Content-Type", ""), text, status, code, case=case)


def check_problem(
    actual_status: int, content_type: str, text: str, status: int, code: str, *, case: object = None
) -> dict[str, Any]:
    """``expect_problem`` for an answer already read: its status, ``Content-Type`` header and body text."""
    assert actual_status == status, f"{case}: {actual_status} != {status}: {text}"
    assert content_type.partition(";")[0] == PROBLEM_TYPE, f"{case}: {content_type}"
    body: dict[str, Any] = json.loads(text)
    assert body.keys() >= PROBLEM_MEMBERS, (case, body)
    assert body["status"] == status, (case, body)
    assert body["code"] == code, (case, body)
    return body


def challenge(description: str) -> str:
    """The ``WWW-Authenticate`` value of a 401 whose ``error_description`` is ``description``."""
    return f'Bearer error="invalid_token", error_description="{description}"'


def metric_samples(text: str) -> dict[str, float]:
    """A Prometheus text exposition as ``{"name{label=value,...}": value}``, labels sorted (``name{}`` without)."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{key}={value}" for key, value in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples
