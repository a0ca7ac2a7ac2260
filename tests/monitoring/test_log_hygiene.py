"""No part ever logs a message body, a token or a signed URL (docs/monitoring.md: Monitoring), even at DEBUG: a known
body and token go through the whole pipeline (send, import, refusals, export, download, janitor passes) of a
system of its own, then every line every part wrote is searched for them. The lines of an attempt carry
its operation id, generation, attempt and phase.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devtools.broker import delete_broker_objects
from devtools.localsystem import LocalSystem
from shared.auth import mint_token
from tests.support import AMQP_URL, cloned_database, wait_for

pytestmark = pytest.mark.e2e

# Six bytes, the default body limit; no id, key or number the parts log can contain them.
SHORT_BODY = "秘密"
LONG_BODY = f"the-secret-body-{uuid.uuid4().hex}"
SIGNED_URL_MARKS = ("X-Amz-Signature", "X-Amz-Credential", "Signature=")


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where every process of ``debug_system`` writes its output, one ``<name>.log`` each."""
    return tmp_path_factory.mktemp("hygiene-logs")


@pytest.fixture(scope="module")
async def debug_system(template_db: str, log_dir: Path) -> AsyncIterator[LocalSystem]:
    """The compose file's parts (one worker, one janitor) logging at DEBUG into ``log_dir``."""
    async with cloned_database(template_db, "chatexport_logs") as database_url:
        local = LocalSystem(
            database_url=database_url,
            amqp_url=AMQP_URL,
            log_dir=log_dir,
            overrides={"CHATEXPORT_LOG_LEVEL": "DEBUG", "CHATEXPORT_JANITOR_INTERVAL_SECONDS": "0.5"},
        )
        try:
            local.start(workers=1, janitors=1)
            yield local
        finally:
            local.stop()
            await delete_broker_objects(local.settings())


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def push_secrets_through(http: aiohttp.ClientSession, admin: str, alice: str) -> str:
    """Store, refuse and export the known bodies with alice's token; return the download's text."""
    assert (await http.put("/admin/conversations/c-logs", json={"members": ["alice"]}, headers=bearer(admin))).ok
    sent = await http.post(
        "/v2/conversations/c-logs/messages", json={"message_id": "m-1", "body": SHORT_BODY}, headers=bearer(alice)
    )
    assert sent.status == 200, await sent.text()
    line = json.dumps({"message_id": "m-2", "sender_id": "alice", "body": LONG_BODY}) + "\n"
    imported = await http.post(
        "/admin/conversations/c-logs/messages:import",
        data=line.encode(),
        headers={**bearer(admin), "Content-Type": "application/x-ndjson"},
    )
    assert imported.status == 200, await imported.text()
    # Refused requests carrying the secrets: a body over the limit, a bad line, a tampered token.
    too_long = await http.post(
        "/v2/conversations/c-logs/messages", json={"message_id": "m-3", "body": LONG_BODY}, headers=bearer(alice)
    )
    assert too_long.status in (413, 422)
    bad_line = await http.post(
        "/admin/conversations/c-logs/messages:import",
        data=f'{{"message_id": "m-4", "body": "{LONG_BODY}"}}\n'.encode(),
        headers={**bearer(admin), "Content-Type": "application/x-ndjson"},
    )
    assert bad_line.status == 422
    assert (await http.get("/v3/operations", headers=bearer(alice[:-2] + "xx"))).status == 401
    return await export_and_download(http, alice)


async def export_and_download(http: aiohttp.ClientSession, alice: str) -> str:
    submitted = await http.post(
        "/v3/conversations/c-logs/exports",
        json={"format": "jsonl"},
        headers={**bearer(alice), "Idempotency-Key": "logs-1"},
    )
    assert submitted.status == 202
    location = submitted.headers["Location"]

    async def succeeded() -> bool:
        response = await http.get(location, headers=bearer(alice))
        return (await response.json())["state"] == "SUCCEEDED"

    await wait_for(succeeded, timeout=60)
    download = await http.get(location.replace("/operations/", "/exports/") + "/result", headers=bearer(alice))
    assert download.status == 200
    return await download.text()


def part_logs(system: LocalSystem, log_dir: Path) -> dict[str, str]:
    """Everything each part wrote, by process name (not the S3 emulator's or the one-shot migration's)."""
    return {name: (log_dir / f"{name}.log").read_text(encoding="utf-8") for name in system.metrics_ports}


async def janitor_passes(system: LocalSystem) -> int:
    url = f"http://127.0.0.1:{system.metrics_ports['janitor']}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        text = await response.text()
    line = next(line for line in text.splitlines() if line.startswith('chatexport_janitor_passes_total{outcome="ok"}'))
    return int(float(line.split()[-1]))


async def test_no_part_logs_a_body_a_token_or_a_signed_url(debug_system: LocalSystem, log_dir: Path) -> None:
    settings = debug_system.settings()
    admin = mint_token(settings, user_id="root", scopes=["admin"])
    alice = mint_token(settings, user_id="alice")
    async with aiohttp.ClientSession(base_url=debug_system.base_url) as http:
        exported = await push_secrets_through(http, admin, alice)
    assert SHORT_BODY in exported and LONG_BODY in exported  # the secrets went all the way through
    # Two more janitor passes see the finished export.
    passes = await janitor_passes(debug_system)
    await wait_for(lambda: _more(debug_system, passes + 2), timeout=30)

    logs = part_logs(debug_system, log_dir)

    assert set(logs) == {"api", "relay", "worker", "janitor"}
    secrets = {
        "short body": SHORT_BODY,
        "short body, JSON-escaped": json.dumps(SHORT_BODY)[1:-1],
        "long body": LONG_BODY,
        "alice's token": alice,
        "alice's token signature": alice.rsplit(".", 1)[1],
        "admin token": admin,
        "admin token signature": admin.rsplit(".", 1)[1],
    }
    for name, text in logs.items():
        lines = [json.loads(line) for line in text.splitlines()]  # structured: every line one JSON object
        assert lines and all({"time", "level", "service", "msg"} <= set(line) for line in lines), name
        for what, secret in secrets.items():
            assert secret not in text, f"{what} in {name}'s log"
        for mark in SIGNED_URL_MARKS:
            assert mark not in text, f"a signed URL in {name}'s log"


async def _more(system: LocalSystem, passes: int) -> bool:
    return await janitor_passes(system) >= passes


async def test_an_attempts_lines_name_its_operation_generation_attempt_and_phase(
    debug_system: LocalSystem, log_dir: Path
) -> None:
    settings = debug_system.settings()
    alice = mint_token(settings, user_id="alice")
    admin = mint_token(settings, user_id="root", scopes=["admin"])
    async with aiohttp.ClientSession(base_url=debug_system.base_url) as http:
        assert (await http.put("/admin/conversations/c-phases", json={"members": ["alice"]}, headers=bearer(admin))).ok
        submitted = await http.post(
            "/v3/conversations/c-phases/exports",
            json={"format": "jsonl"},
            headers={**bearer(alice), "Idempotency-Key": "phases-1"},
        )
        operation_id = (await submitted.json())["operation_id"]

    def worker_lines() -> list[dict[str, Any]]:
        text = (log_dir / "worker.log").read_text(encoding="utf-8")
        lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("operation_id") == operation_id]

    lines = await wait_for(lambda: [line for line in worker_lines() if line["msg"] == "export succeeded"], timeout=60)

    assert all(line["level"] and line["service"] == "worker" for line in worker_lines())
    assert (lines[0]["generation"], lines[0]["attempt"]) == (1, 1)
    assert lines[0]["phase"] == "uploading"  # the phase the attempt was in when it logged
