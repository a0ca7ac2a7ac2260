"""Completion callbacks on the real processes (docs/api.md: Completion callbacks): an export's
callback reaches a local receiver that was down when the export ended, signed with the owner's secret.
This system of its own allows private addresses (a setting for development and tests only), so that the
receiver can listen on this machine. Another, with the private addresses refused, sends its callbacks
through an egress proxy, which alone knows where the receiver's name leads; no part logs its password.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from devtools.certificates import certificate_for
from devtools.localsystem import LocalSystem
from tests.support import cloned_database, unique, wait_for
from tests.support.api_calls import import_lines, make_conversation, submit, verified_callback, wait_terminal
from tests.support.e2e import headers_for, local_system
from tests.support.sockets import refusing_socket
from tests.support.webhook_peers import ConnectProxy, Receiver, listening

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
    auth = headers_for(permissive_system)
    receiver = contextlib.ExitStack()
    silent = receiver.enter_context(refusing_socket())
    port = silent.getsockname()[1]
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
        # The port held silent so far now listens: the same address the callback was refused at.
        await web.SockSite(runner, silent).start()
        try:
            await wait_for(lambda: received, timeout=30)
        finally:
            await runner.cleanup()
            receiver.close()
        secret = (await (await api.get("/v3/webhooks/secret", headers=auth(user))).json())["secret"]

    headers, payload = received[0]
    message = verified_callback(secret, headers, payload)
    assert (message["type"], message["data"]["operation_id"]) == ("export.succeeded", operation["operation_id"])


@pytest.fixture(scope="module")
async def proxy() -> AsyncIterator[ConnectProxy]:
    """A CONNECT proxy that knows no name yet."""
    async with ConnectProxy({}, user="relay", password="pr0xy-s3cret") as running:
        yield running


@dataclass
class Proxied:
    """A system whose callbacks go through the proxy: its log folder, and the TLS context of a receiver
    whose certificate, for ``hooks.example.test``, is the only one its parts trust.
    """

    system: LocalSystem
    logs: Path
    receiver_tls: ssl.SSLContext


@pytest.fixture(scope="module")
async def proxied(
    template_db: str, proxy: ConnectProxy, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Proxied]:
    """The compose file's parts on a database of their own, every callback through ``proxy``."""
    certificates, logs = tmp_path_factory.mktemp("certificates"), tmp_path_factory.mktemp("e2e-proxied-logs")
    receiver_tls, _ = certificate_for("hooks.example.test", certificates)
    overrides = {"CHATEXPORT_WEBHOOK_PROXY_URL": proxy.url, "SSL_CERT_FILE": str(certificates / "cert.pem")}
    async with (
        cloned_database(template_db, "chatexport_proxied") as database,
        local_system(database, logs, **overrides) as local,
    ):
        yield Proxied(local, logs, receiver_tls)


async def test_a_callback_goes_through_the_proxy_which_alone_resolves_the_name(
    proxied: Proxied, proxy: ConnectProxy
) -> None:
    auth = headers_for(proxied.system)
    receiver, user, cid = Receiver(), unique("proxied-user"), unique("proxied-conversation")
    async with (
        listening(receiver, ssl_context=proxied.receiver_tls) as port,
        aiohttp.ClientSession(base_url=proxied.system.base_url) as api,
    ):
        proxy.routes["hooks.example.test"] = port
        await make_conversation(api, auth, cid, [user])
        await import_lines(api, auth, cid, [{"message_id": "m1", "sender_id": user, "body": "x"}])
        body = {"format": "jsonl", "notify": {"url": "https://hooks.example.test:8443/hook"}}
        response = await submit(api, auth, user, cid, body, unique("key"))
        assert response.status == 202, await response.text()
        operation = await wait_terminal(api, auth, user, response.headers["Location"], timeout=60)
        await wait_for(lambda: receiver.received, timeout=30)
        # The relay logs the attempt after it records the answer, so the log line can trail the request.
        relay_log = proxied.logs / "relay.log"
        await wait_for(lambda: "webhook attempt" in relay_log.read_text(encoding="utf-8"), timeout=30)
        secret = (await (await api.get("/v3/webhooks/secret", headers=auth(user))).json())["secret"]

    headers, payload = receiver.received[0]
    message = verified_callback(secret, headers, payload)
    assert (message["type"], message["data"]["operation_id"]) == ("export.succeeded", operation["operation_id"])
    assert ("CONNECT hooks.example.test:8443 HTTP/1.1", "Basic cmVsYXk6cHIweHktczNjcmV0") in proxy.requests
    logs = {path.name: path.read_text(encoding="utf-8") for path in proxied.logs.glob("*.log")}
    assert [name for name, text in logs.items() if "pr0xy-s3cret" in text] == []
