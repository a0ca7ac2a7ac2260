"""Completion callbacks on the real processes (README: API reference, Completion callbacks): an export's
callback reaches a local receiver that was down when the export ended, signed with the owner's secret.
This system of its own allows private addresses (a setting for development and tests only), so that the
receiver can listen on this machine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from devtools.localsystem import LocalSystem
from devtools.moto import free_port
from shared.auth import mint_token
from tests.conftest import cloned_database, unique, wait_for
from tests.e2e.conftest import local_system
from tests.helpers import import_lines, make_conversation, submit, verified_callback, wait_terminal

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
async def permissive_database(template_db: str) -> AsyncIterator[str]:
    """A database of its own: another system's janitor must never wake this one's operations."""
    async with cloned_database(template_db, "chatexport_hooks") as url:
        yield url


@pytest.fixture(scope="module")
async def permissive_system(
    permissive_database: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LocalSystem]:
    """The compose file's parts, with callbacks allowed to private addresses."""
    overrides = {"CHATEXPORT_ENVIRONMENT": "development", "CHATEXPORT_WEBHOOK_ALLOW_PRIVATE": "true"}
    async with local_system(permissive_database, tmp_path_factory.mktemp("e2e-webhook-logs"), **overrides) as local:
        yield local


async def test_a_callback_reaches_a_receiver_that_was_down_when_the_export_ended(
    permissive_system: LocalSystem,
) -> None:
    settings = permissive_system.settings()

    def auth(user_id: str, *, admin: bool = False) -> dict[str, str]:
        token = mint_token(settings, user_id=user_id, scopes=["admin"] if admin else None)
        return {"Authorization": f"Bearer {token}"}

    port = free_port()
    received: list[tuple[dict[str, str], bytes]] = []
    user, cid = unique("hook-user"), unique("hook-conversation")
    async with aiohttp.ClientSession(base_url=permissive_system.base_url) as api:
        await make_conversation(api, auth, cid, [user])
        await import_lines(api, auth, cid, [{"message_id": "m1", "sender_id": user, "body": "x"}])
        body = {"format": "jsonl", "notify": {"url": f"http://127.0.0.1:{port}/hook"}}
        response = await submit(api, auth, user, cid, body, unique("key"))
        assert response.status == 202, await response.text()
        location = response.headers["Location"]
        operation = await wait_terminal(api, auth, user, location, timeout=60)
        assert operation["state"] == "SUCCEEDED"

        async def attempts() -> int:
            view = await (
                await api.get(f"/admin/operations/{operation['operation_id']}", headers=auth("root", admin=True))
            ).json()
            return sum(len(delivery["attempts"]) for delivery in view["webhook_deliveries"])

        # Nobody listens yet: the first attempt fails and another is scheduled.
        await wait_for(attempts, timeout=30)

        async def hook(request: web.Request) -> web.Response:
            received.append((dict(request.headers), await request.read()))
            return web.Response(status=204)

        app = web.Application()
        app.router.add_post("/hook", hook)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            await wait_for(lambda: received, timeout=30)
        finally:
            await runner.cleanup()
        secret = (await (await api.get("/v3/webhooks/secret", headers=auth(user))).json())["secret"]

    headers, payload = received[0]
    message = verified_callback(secret, headers, payload)
    assert (message["type"], message["data"]["operation_id"]) == ("export.succeeded", operation["operation_id"])
