"""Completion callbacks end to end on the real API, relay, worker and janitor (docs/api.md:
Completion callbacks): a signed message at a local receiver when the export ends, delivered again after
the receiver was down, every attempt shown to operators; the URL rules at delivery, whatever the spelling;
the egress proxy that decides instead of the relay, whose password no log line shows; each user's secret;
the claim's lease, with nothing held in the database while a request is in flight, its fencing generation,
and the receiver's connection kept for the next callback.
Private addresses are allowed here by the setting meant for tests, so that the receiver can be local,
except in the tests of the address rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from pydantic import SecretStr

from devtools.broker import delete_broker_objects
from devtools.certificates import certificate_for
from devtools.moto import MotoServer
from services.relay import webhooks
from services.relay.webhooks import LEASE_MARGIN_SECONDS, WebhookSender
from shared.logs import JsonFormatter
from shared.repository import webhook_deliveries
from shared.repository.webhook_deliveries import Attempt
from shared.settings import Settings
from tests.support import documented, make_settings, wait_for
from tests.support.api_calls import expect_problem, import_lines, make_conversation, submit, verified_callback
from tests.support.messages import Auth, Client
from tests.support.rows import insert_operation
from tests.support.webhook_peers import ConnectProxy, Receiver, listening, send_due, trickling

pytestmark = pytest.mark.module_database  # every test starts from empty tables (tests/conftest.py)


@pytest.fixture
async def settings(database_url: str, moto: MotoServer) -> AsyncIterator[Settings]:
    """This test's settings, with callbacks allowed to private addresses."""
    test_settings = make_settings(database_url, moto.endpoint_url, webhook_allow_private=True)
    yield test_settings
    await delete_broker_objects(test_settings)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    state = Receiver()
    async with listening(state) as port:
        state.url = f"http://127.0.0.1:{port}/hook?token=receiver-secret"
        yield state


async def exported_with_callback(api: Client, auth: Auth, url: str, key: str) -> str:
    await make_conversation(api, auth, "c-hook", ["alice"])
    await import_lines(
        api, auth, "c-hook", [{"message_id": f"m{n}", "sender_id": "alice", "body": "x"} for n in range(5)]
    )
    response = await submit(api, auth, "alice", "c-hook", {"format": "jsonl", "notify": {"url": url}}, key)
    assert response.status == 202, await response.text()
    operation_id: str = (await response.json())["operation_id"]
    return operation_id


async def verify(api: Client, auth: Auth, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """The message, once its signature checks out with alice's secret as the API gives it."""
    secret = (await (await api.get("/v3/webhooks/secret", headers=auth("alice"))).json())["secret"]
    return verified_callback(secret, headers, body)


async def delivered(api: Client, auth: Auth, operation_id: str) -> list[dict[str, Any]]:
    """The operation's deliveries as operators see them, once every one is recorded as delivered."""
    response = await api.get(f"/admin/operations/{operation_id}", headers=auth("root", admin=True))
    deliveries: list[dict[str, Any]] = (await response.json())["webhook_deliveries"]
    return deliveries if deliveries and all(d["delivered_at"] for d in deliveries) else []


async def test_a_signed_callback_arrives_when_the_export_succeeds(
    api: Client, auth: Auth, pool: asyncpg.Pool, receiver: Receiver, pipeline: None
) -> None:
    operation_id = await exported_with_callback(api, auth, receiver.url, "k-hook")

    await wait_for(lambda: receiver.received, timeout=30)
    headers, body = receiver.received[0]
    message = await verify(api, auth, headers, body)
    assert message["type"] == "export.succeeded"
    assert (message["data"]["operation_id"], message["data"]["state"]) == (operation_id, "SUCCEEDED")
    assert headers["webhook-id"].startswith("msg_")

    # The receiver has the message before the relay records its 200, so wait for the record.
    [delivery] = await wait_for(lambda: delivered(api, auth, operation_id), timeout=30)
    assert delivery["delivered_at"] is not None and "url" not in delivery
    assert [attempt["status_code"] for attempt in delivery["attempts"]] == [200]


async def test_a_receiver_that_was_down_gets_the_same_event_later(
    api: Client, auth: Auth, pool: asyncpg.Pool, receiver: Receiver, pipeline: None
) -> None:
    receiver.status = 503
    operation_id = await exported_with_callback(api, auth, receiver.url, "k-down")
    await wait_for(lambda: receiver.received, timeout=30)
    receiver.status = 200

    # The first retry comes 2.5-5 s after the refused attempt.
    await wait_for(lambda: len(receiver.received) >= 2, timeout=30)
    (first_headers, _), (second_headers, second_body) = receiver.received[:2]
    assert first_headers["webhook-id"] == second_headers["webhook-id"]
    assert (await verify(api, auth, second_headers, second_body))["type"] == "export.succeeded"
    [delivery] = await wait_for(lambda: delivered(api, auth, operation_id), timeout=30)
    assert [attempt["status_code"] for attempt in delivery["attempts"]][:2] == [503, 200]


async def test_each_user_reads_a_secret_of_their_own(api: Client, auth: Auth) -> None:
    alice = await (await api.get("/v3/webhooks/secret", headers=auth("alice"))).json()
    bob = await (await api.get("/v3/webhooks/secret", headers=auth("bob"))).json()
    assert alice["secret"].startswith("whsec_") and alice["secret"] != bob["secret"]
    assert alice["previous_secret"] is None
    await expect_problem(await api.get("/v3/webhooks/secret"), 401, "UNAUTHENTICATED")


async def ended_with_callback(pool: asyncpg.Pool, operation_id: str, url: str) -> None:
    """An operation that failed with ``url`` to notify: the trigger writes its delivery, due at once. The URL
    never met the submit's check, as a row written before a rule changed would not have.
    """
    await insert_operation(pool, operation_id, "RUNNING", notify_url=url)
    await pool.execute("UPDATE operations SET state = 'FAILED' WHERE operation_id = $1", operation_id)


async def attempt_errors(pool: asyncpg.Pool) -> dict[str, str]:
    """Each delivery's URL -> the error its attempt recorded."""
    rows = await pool.fetch(
        "SELECT d.url, a.error FROM webhook_attempts a JOIN webhook_deliveries d USING (delivery_id)"
    )
    return {row["url"]: row["error"] for row in rows}


async def test_a_batch_of_due_callbacks_is_sent_together(
    auth: Auth, pool: asyncpg.Pool, receiver: Receiver, settings: Settings
) -> None:
    for operation_id in ("op_hook_1", "op_hook_2"):
        await ended_with_callback(pool, operation_id, receiver.url)

    assert await send_due(pool, settings) == 2

    types = sorted(json.loads(body)["type"] for _, body in receiver.received)
    assert types == ["export.failed", "export.failed"]
    assert await pool.fetchval("SELECT count(*) FROM webhook_deliveries WHERE delivered_at IS NOT NULL") == 2


# Internal addresses spelt as the submit once let them through; the relay must refuse each before connecting.
INTERNAL_URLS = [
    "https://169.254.169.254./latest",
    "https://127.0.0.1./hook",
    "https://127。0。0。1/hook",
    "https://localhost。/hook",
    "https://[64:ff9b::7f00:1]/hook",
    "https://[64:ff9b::a9fe:a9fe]/latest",
    "https://[2002:7f00:1::]/hook",
    "https://[2001:0:808:808::80ff:fffe]/hook",
]
# Names, and what an injected resolver answers for them: each hides an internal address in an IPv6 form.
RESOLVED = {
    "nat64.hooks.test": ["64:ff9b::7f00:1"],
    "metadata.hooks.test": ["93.184.216.34", "64:ff9b::a9fe:a9fe"],
    "sixtofour.hooks.test": ["2002:7f00:1::"],
    "teredo.hooks.test": ["2001:0:808:808::80ff:fffe"],
    "xn--bcher-kva.hooks.test": ["::ffff:127.0.0.1"],
}
NAMED_URLS = [
    "https://NAT64.hooks.test./hook",
    "https://metadata.hooks.test/latest",
    "https://sixtofour.hooks.test/hook",
    "https://teredo.hooks.test/hook",
    "https://Bücher.hooks.test./hook",
]


async def test_the_relay_refuses_an_internal_address_in_any_spelling(pool: asyncpg.Pool, settings: Settings) -> None:
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return RESOLVED[host]

    urls = INTERNAL_URLS + NAMED_URLS
    for number, url in enumerate(urls):
        await ended_with_callback(pool, f"op_internal_{number}", url)
    strict = settings.model_copy(update={"webhook_allow_private": False})

    assert await send_due(pool, strict, resolve=resolve) == len(urls)

    errors = await attempt_errors(pool)
    assert {url: errors[url].split(":")[0] for url in urls} == dict.fromkeys(urls, "refused")
    # Only names were looked up, each as a resolver reads it (IDNA, no trailing dot).
    assert sorted(asked) == sorted(RESOLVED)


async def unresolvable(host: str, port: int) -> list[str]:
    """A resolver for senders that must resolve nothing: the proxy resolves."""
    raise AssertionError(f"the relay resolved {host} itself")


async def test_through_the_proxy_the_relay_asks_for_the_name_and_the_proxy_decides(
    pool: asyncpg.Pool, settings: Settings, tmp_path: Path
) -> None:
    server_tls, client_tls = certificate_for("hooks.example.test", tmp_path)
    receiver = Receiver()
    async with listening(receiver, ssl_context=server_tls) as port:
        routes = {"hooks.example.test": port}
        async with ConnectProxy(routes, user="relay", password="pr0xy-s3cret") as proxy:
            allowed, blocked, internal = (
                "https://Hooks.Example.Test.:8443/hook?token=receiver-secret",
                "https://blocked.example.test/hook",
                "https://[64:ff9b::7f00:1]/hook",
            )
            for number, url in enumerate((allowed, blocked, internal)):
                await ended_with_callback(pool, f"op_proxied_{number}", url)
            proxied = settings.model_copy(
                update={"webhook_allow_private": False, "webhook_proxy_url": SecretStr(proxy.url)}
            )
            assert await send_due(pool, proxied, resolve=unresolvable, ssl_context=client_tls) == 3

    errors = await attempt_errors(pool)
    assert (errors[allowed], errors[blocked]) == (None, "the proxy answered 403")
    assert errors[internal].startswith("refused: ")  # the submit's rules still hold, before the proxy is asked
    [(headers, body)] = receiver.received
    assert json.loads(body)["type"] == "export.failed" and headers["Host"] == "hooks.example.test:8443"
    # The proxy was asked for the names as normalised, with the credentials of its URL.
    assert sorted(proxy.requests) == [
        ("CONNECT blocked.example.test:443 HTTP/1.1", "Basic cmVsYXk6cHIweHktczNjcmV0"),
        ("CONNECT hooks.example.test:8443 HTTP/1.1", "Basic cmVsYXk6cHIweHktczNjcmV0"),
    ]


async def test_no_log_line_and_no_attempt_shows_the_proxy_password(
    pool: asyncpg.Pool, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    await ended_with_callback(pool, "op_proxy_password", "https://hooks.example.test/hook")

    async def send_through(proxy_url: str) -> None:
        proxied = settings.model_copy(update={"webhook_proxy_url": SecretStr(proxy_url)})
        assert "pr0xy-s3cret" not in repr(proxied)
        with caplog.at_level(logging.DEBUG):
            assert await send_due(pool, proxied, resolve=unresolvable) == 1
        await pool.execute("UPDATE webhook_deliveries SET next_attempt_at = now()")

    async with ConnectProxy({}, user="relay", password="right-one") as proxy:
        await send_through(proxy.url.replace("right-one", "pr0xy-s3cret"))  # refused: 407
    await send_through(proxy.url.replace("right-one", "pr0xy-s3cret"))  # the proxy is gone

    errors = [row["error"] for row in await pool.fetch("SELECT error FROM webhook_attempts ORDER BY attempt")]
    assert errors == ["the proxy answered 407", "ClientProxyConnectionError"]
    lines = [JsonFormatter("relay").format(record) for record in caplog.records]
    assert len([line for line in lines if "webhook attempt" in line]) == 2
    assert not [line for line in lines if "pr0xy-s3cret" in line]


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_one_deadline_covers_the_whole_attempt(pool: asyncpg.Pool, settings: Settings, scheme: str) -> None:
    async def slow_resolve(host: str, port: int) -> list[str]:
        await asyncio.sleep(0.5)  # a resolver that takes half of the deadline
        return ["127.0.0.1"]

    timed = settings.model_copy(update={"webhook_timeout_seconds": 1.0})
    async with trickling() as port:
        # Over http the headers trickle in; over https the handshake never completes.
        await ended_with_callback(pool, "op_slow", f"{scheme}://slow.hooks.test:{port}/hook")
        assert await send_due(pool, timed, resolve=slow_resolve) == 1

    attempt = await pool.fetchrow("SELECT error, duration_ms FROM webhook_attempts")
    assert attempt["error"] == "TimeoutError"
    assert 1000 <= attempt["duration_ms"] <= 1300


async def test_nothing_is_held_in_the_database_while_a_callback_is_in_flight(
    pool: asyncpg.Pool, receiver: Receiver, settings: Settings
) -> None:
    receiver.release = asyncio.Event()
    await ended_with_callback(pool, "op_lease_held", receiver.url)
    sending = asyncio.create_task(send_due(pool, settings))
    await wait_for(lambda: receiver.received)

    # The request is in flight: its row is not locked, no transaction is open, and the lease is taken.
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(
            "SELECT generation, extract(epoch FROM next_attempt_at - now()) AS leased_for"
            " FROM webhook_deliveries WHERE operation_id = 'op_lease_held' FOR UPDATE NOWAIT"
        )
    assert row["generation"] == 1
    assert row["leased_for"] > settings.webhook_timeout_seconds + LEASE_MARGIN_SECONDS - 5
    open_transactions = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'"
    )
    assert open_transactions == 0

    receiver.release.set()
    assert await asyncio.wait_for(sending, 20) == 1
    delivered = await pool.fetchval("SELECT delivered_at IS NOT NULL FROM webhook_deliveries")
    assert delivered


async def test_a_lease_that_ran_out_is_claimed_again_and_the_late_record_changes_nothing(
    pool: asyncpg.Pool, receiver: Receiver, settings: Settings
) -> None:
    await ended_with_callback(pool, "op_lease_lost", receiver.url)
    async with pool.acquire() as conn:
        # A relay claims the delivery, then stalls or dies before it records anything.
        [stalled] = await webhook_deliveries.claim_due(conn, limit=10, lease_seconds=60)
        assert await webhook_deliveries.claim_due(conn, limit=10, lease_seconds=60) == []
        await conn.execute("UPDATE webhook_deliveries SET next_attempt_at = now()")  # the lease has run out

        assert await send_due(pool, settings) == 1
        assert len(receiver.received) == 1

        late = Attempt(stalled, datetime.now(UTC), 503, 10, "HTTP 503", 5.0)
        assert await webhook_deliveries.record_attempts(conn, [late]) == []
        row = await conn.fetchrow("SELECT generation, attempts, delivered_at FROM webhook_deliveries")
    assert (row["generation"], row["attempts"]) == (2, 1)
    assert row["delivered_at"] is not None
    assert await pool.fetchval("SELECT count(*) FROM webhook_attempts") == 1


async def test_a_batch_still_being_sent_keeps_its_lease_by_the_heartbeat(
    pool: asyncpg.Pool, receiver: Receiver, settings: Settings
) -> None:
    receiver.release = asyncio.Event()
    await ended_with_callback(pool, "op_lease_kept", receiver.url)
    beating = settings.model_copy(update={"heartbeat_seconds": 0.2})
    sending = asyncio.create_task(send_due(pool, beating))
    await wait_for(lambda: receiver.received)
    claimed = await pool.fetchrow("SELECT generation, next_attempt_at FROM webhook_deliveries")

    async def extended() -> bool:
        row = await pool.fetchrow("SELECT generation, next_attempt_at FROM webhook_deliveries")
        return bool(row["next_attempt_at"] > claimed["next_attempt_at"] and row["generation"] == claimed["generation"])

    await wait_for(extended)
    receiver.release.set()
    assert await asyncio.wait_for(sending, 20) == 1
    row = await pool.fetchrow("SELECT generation, delivered_at FROM webhook_deliveries")
    assert (row["generation"], row["delivered_at"] is not None) == (claimed["generation"], True)


async def test_an_extension_leaves_a_delivery_recorded_or_claimed_again_as_it_is(pool: asyncpg.Pool) -> None:
    for operation_id in ("op_extend_held", "op_extend_retry", "op_extend_lost"):
        await ended_with_callback(pool, operation_id, "https://hooks.example.com/hook")
    async with pool.acquire() as conn:
        claimed = {d.operation_id: d for d in await webhook_deliveries.claim_due(conn, limit=10, lease_seconds=5)}
        retry = Attempt(claimed["op_extend_retry"], datetime.now(UTC), 503, 10, "HTTP 503", 2.0)
        assert await webhook_deliveries.record_attempts(conn, [retry]) == [retry.delivery.delivery_id]
        await conn.execute(
            "UPDATE webhook_deliveries SET generation = generation + 1 WHERE operation_id = 'op_extend_lost'"
        )
        before = dict(await conn.fetch("SELECT operation_id, next_attempt_at FROM webhook_deliveries"))

        assert await webhook_deliveries.extend(conn, list(claimed.values()), lease_seconds=600) == 1
        after = dict(await conn.fetch("SELECT operation_id, next_attempt_at FROM webhook_deliveries"))
    assert after["op_extend_held"] > before["op_extend_held"]
    assert after["op_extend_retry"] == before["op_extend_retry"]
    assert after["op_extend_lost"] == before["op_extend_lost"]


async def test_one_sender_reuses_the_receivers_connection(
    pool: asyncpg.Pool, receiver: Receiver, settings: Settings
) -> None:
    async with WebhookSender(pool=pool, settings=settings) as sender:
        for operation_id in ("op_reuse_1", "op_reuse_2"):
            await ended_with_callback(pool, operation_id, receiver.url)
            assert await sender.send_due() == 1
    assert len(receiver.peers) == 2
    assert receiver.peers[0] == receiver.peers[1]


async def test_a_kept_connection_the_receiver_closes_is_not_a_failed_attempt(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    """The receiver answers one request per connection and closes the next one unanswered, as a receiver
    whose keep-alive ends while the callback is on its way does: the callback goes again on a new connection.
    """

    async def one_answer_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(one_answer_per_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with WebhookSender(pool=pool, settings=settings) as sender:
            for operation_id in ("op_kept_1", "op_kept_2"):
                await ended_with_callback(pool, operation_id, f"http://127.0.0.1:{port}/hook")
                assert await sender.send_due() == 1
    finally:
        server.close()
    attempts = await pool.fetch("SELECT status_code, error FROM webhook_attempts ORDER BY delivery_id")
    assert [(row["status_code"], row["error"]) for row in attempts] == [(200, None), (200, None)]


async def test_each_attempt_is_recorded_as_it_ends_with_its_own_time(pool: asyncpg.Pool, settings: Settings) -> None:
    """Two callbacks of one batch, one to a receiver that hangs: the other is recorded while it hangs, and
    each attempt keeps the time it began.
    """
    release = asyncio.Event()
    hanging, prompt = Receiver(release=release), Receiver()
    async with listening(hanging) as hanging_port, listening(prompt) as prompt_port:
        await ended_with_callback(pool, "op_hangs", f"http://127.0.0.1:{hanging_port}/hook")
        await ended_with_callback(pool, "op_prompt", f"http://127.0.0.1:{prompt_port}/hook")
        sending = asyncio.create_task(send_due(pool, settings))
        await wait_for(lambda: hanging.received)
        await wait_for(
            lambda: pool.fetchval(
                "SELECT delivered_at IS NOT NULL FROM webhook_deliveries WHERE operation_id = 'op_prompt'"
            )
        )
        assert await pool.fetchval("SELECT count(*) FROM webhook_attempts") == 1
        release.set()
        assert await asyncio.wait_for(sending, 20) == 2
    rows = await pool.fetch(
        "SELECT d.operation_id, d.delivered_at, a.attempted_at"
        " FROM webhook_attempts a JOIN webhook_deliveries d USING (delivery_id)"
    )
    times = {row["operation_id"]: row for row in rows}
    # The hanging one began before the prompt one was delivered, and was delivered after.
    assert times["op_hangs"]["attempted_at"] < times["op_prompt"]["delivered_at"] < times["op_hangs"]["delivered_at"]


async def test_a_new_connection_closed_unanswered_is_one_request_and_its_attempt(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    """A receiver that reads the request on a new connection and closes it unanswered got the request: it is
    not sent again, and its attempt records the error.
    """
    requests: list[bytes] = []

    async def read_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            requests.append(await reader.readuntil(b"\r\n\r\n"))
        writer.close()

    server = await asyncio.start_server(read_and_close, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await ended_with_callback(pool, "op_closed", f"http://127.0.0.1:{port}/hook")
        assert await send_due(pool, settings) == 1
    finally:
        server.close()
    assert len(requests) == 1
    assert await attempt_errors(pool) == {f"http://127.0.0.1:{port}/hook": "ServerDisconnectedError"}


async def test_a_hanging_receiver_holds_back_no_callback_due_after_it(pool: asyncpg.Pool, settings: Settings) -> None:
    """The relay's loop claims again while a receiver hangs: a callback due later reaches another receiver
    long before the hanging one's deadline, and the hanging one is recorded once it answers.
    """
    release, stop = asyncio.Event(), asyncio.Event()
    hanging, prompt = Receiver(release=release), Receiver()
    patient = settings.model_copy(update={"relay_poll_seconds": 0.05, "webhook_timeout_seconds": 120.0})
    async with (
        listening(hanging) as hanging_port,
        listening(prompt) as prompt_port,
        WebhookSender(pool=pool, settings=patient) as sender,
    ):
        await ended_with_callback(pool, "op_hangs", f"http://127.0.0.1:{hanging_port}/hook")
        running = asyncio.create_task(sender.run(stop=stop))
        await wait_for(lambda: hanging.received)
        await ended_with_callback(pool, "op_after", f"http://127.0.0.1:{prompt_port}/hook")
        await wait_for(lambda: prompt.received, timeout=10)
        release.set()
        stop.set()
        await asyncio.wait_for(running, 20)
    delivered = await pool.fetch("SELECT operation_id FROM webhook_deliveries WHERE delivered_at IS NOT NULL")
    assert sorted(row["operation_id"] for row in delivered) == ["op_after", "op_hangs"]


async def test_a_session_in_use_is_never_closed_to_make_room(
    pool: asyncpg.Pool, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for one kept session, callbacks to two addresses at once both arrive: the second session
    does not close the first while its request is still waiting for an answer.
    """
    monkeypatch.setattr(webhooks, "MAX_SESSIONS", 1)
    release = asyncio.Event()
    hanging, prompt = Receiver(release=release), Receiver()
    async with listening(hanging, host="127.0.0.2") as hanging_port, listening(prompt, host="127.0.0.3") as prompt_port:
        await ended_with_callback(pool, "op_hangs", f"http://127.0.0.2:{hanging_port}/hook")
        await ended_with_callback(pool, "op_prompt", f"http://127.0.0.3:{prompt_port}/hook")
        sending = asyncio.create_task(send_due(pool, settings))
        await wait_for(lambda: hanging.received and prompt.received)
        release.set()
        assert await asyncio.wait_for(sending, 20) == 2
    assert await attempt_errors(pool) == {
        f"http://127.0.0.2:{hanging_port}/hook": None,
        f"http://127.0.0.3:{prompt_port}/hook": None,
    }


async def test_idle_sessions_beyond_the_limit_are_closed_least_recently_used_first(
    pool: asyncpg.Pool, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhooks, "MAX_SESSIONS", 2)
    receiver = Receiver()
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    async with contextlib.AsyncExitStack() as stack, WebhookSender(pool=pool, settings=settings) as sender:
        ports = {host: await stack.enter_async_context(listening(receiver, host=host)) for host in hosts}
        # Two sessions fit: the first one's connection is kept. A third closes the least recently used.
        for number, host in enumerate(["127.0.0.2", "127.0.0.3", "127.0.0.2", "127.0.0.4", "127.0.0.3"]):
            await ended_with_callback(pool, f"op_lru_{number}", f"http://{host}:{ports[host]}/hook")
            assert await sender.send_due() == 1
    ports_seen = [port for _, port in receiver.peers]
    assert ports_seen[2] == ports_seen[0]  # 127.0.0.2 again, on its kept connection
    assert ports_seen[4] != ports_seen[1]  # 127.0.0.3 was closed to make room for 127.0.0.4


def test_the_documented_batch_figures_are_the_senders() -> None:
    api_reference = documented("api.md")
    assert f"(`SKIP LOCKED`, {webhooks.BATCH} at a time)" in api_reference
    assert f"at most {webhooks.MAX_BATCHES_IN_FLIGHT} batches in flight" in api_reference
    assert f"idle ones closed after {webhooks.KEEPALIVE_SECONDS:g} s" in api_reference
