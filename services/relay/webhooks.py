"""Sending completion callbacks (docs/api.md: Completion callbacks), and the ``schedule.paused`` of a
schedule paused by the system (docs/schedules.md: When a run cannot go on), at least once, driven from
Postgres like the outbox: due deliveries are claimed with ``SKIP LOCKED`` and a lease longer than one
attempt's deadline, sent with no database connection or row lock held, and every attempt is recorded under
the claim's fencing generation (the lease extended by the heartbeat every lease uses while a batch is still
being sent); a failed one is retried with exponential backoff and jitter until
``webhook_retry_seconds`` after the event, and one whose relay died is sent again once its lease ends.

Each URL is checked again right before it is sent, with the very rules of the submit
(``shared.webhooks.targets``). Without a proxy, a name is resolved again, every address it resolves to must
be public, and the connection is pinned to the checked address, so a name that changed to a private one
since the submit (DNS rebinding) reaches nothing. With ``webhook_proxy_url``, every callback goes through
that proxy, which is asked for the name (``CONNECT host:port``) and whose rules decide; its credentials go
in a header, never into a URL an error could quote. No proxy from the environment, no redirect,
one deadline of ``webhook_timeout_seconds`` for the whole attempt, at most ``MAX_ANSWER_BYTES`` of the answer
read and none stored; the URL's query is never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import ssl
import time
from asyncio import FIRST_COMPLETED
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncpg
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from services.relay import metrics
from shared import jsontext, tracing
from shared.db import TRANSIENT_DATABASE_ERRORS
from shared.lease import heartbeating
from shared.payloads import PAYLOAD_VERSION, PAYLOAD_VERSION_FIELD
from shared.repository import schedules, status_monitor, webhook_deliveries
from shared.repository.webhook_deliveries import Attempt, Delivery
from shared.representation import represent, represent_schedule
from shared.settings import RelayPartSettings
from shared.webhooks.signing import signature_header, user_secret
from shared.webhooks.targets import IPAddress, RefusedTarget, Target, check_addresses, check_url

log = logging.getLogger(__name__)

BATCH = 16
# Batches ``run`` keeps in flight at once: up to this many times ``BATCH`` requests, and as many of the
# pool's connections (each batch uses one at a time), which leaves room for the outbox relay's.
MAX_BATCHES_IN_FLIGHT = 4
MAX_ANSWER_BYTES = 4096
MAX_RETRY_SECONDS = 3600.0
# HTTP sessions kept for reuse, one per receiver address (docs/api.md: Completion callbacks).
MAX_SESSIONS = 64
# An idle connection is closed before the shortest keep-alive common servers allow (Node's 5 s), so that a
# callback is not sent on a connection the receiver is closing.
KEEPALIVE_SECONDS = 4.0
# A claim's lease is one attempt's deadline plus this, which covers reading the bodies and recording.
LEASE_MARGIN_SECONDS = 30.0

# (host, port) -> the addresses the name resolves to, as text.
Resolve = Callable[[str, int], Awaitable[list[str]]]


class _Pinned(AbstractResolver):
    """A resolver that answers every lookup with the one address already checked."""

    def __init__(self, address: IPAddress) -> None:
        self._address = address

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        family = socket.AF_INET6 if self._address.version == 6 else socket.AF_INET
        return [
            ResolveResult(
                hostname=host, host=str(self._address), port=port, family=family, proto=0, flags=socket.AI_NUMERICHOST
            )
        ]

    async def close(self) -> None:
        """Nothing to release."""


@dataclass
class _Connection:
    """What a request learnt of its connection: ``reused`` when it was kept from an earlier request."""

    reused: bool = False


def _reuse_trace() -> aiohttp.TraceConfig:
    """A session's trace that marks the ``_Connection`` a request carries as its ``trace_request_ctx`` when
    the request goes on a kept connection (aiohttp's ``on_connection_reuseconn``).
    """

    async def reused(_session: aiohttp.ClientSession, context: SimpleNamespace, _params: object) -> None:
        context.trace_request_ctx.reused = True

    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(reused)
    return trace


def _new_session(address: IPAddress | None) -> aiohttp.ClientSession:
    """A session whose connections go to ``address`` (None: as the proxy's name resolves), kept alive for
    ``KEEPALIVE_SECONDS``, with the trace that tells a kept connection from a new one.
    """
    resolver = None if address is None else _Pinned(address)
    connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False, keepalive_timeout=KEEPALIVE_SECONDS)
    return aiohttp.ClientSession(connector=connector, trust_env=False, trace_configs=[_reuse_trace()])


class WebhookSender:
    """Sends due deliveries until ``run`` is stopped; ``send_due`` sends one batch. Use it as an async
    context manager, which closes its HTTP sessions.

    ``resolve`` names a callback's host (``resolve_host``, the system's resolver, unless a test brings its
    own); ``ssl_context`` holds the certificate authorities receivers are checked against (the system's
    unless given).
    """

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        settings: RelayPartSettings,
        resolve: Resolve | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._pool = pool
        self._settings = settings
        keys = [settings.webhook_signing_key, settings.webhook_previous_signing_key]
        self._keys = [key.encode() for key in keys if key]
        self._resolve = resolve or resolve_host
        self._ssl: ssl.SSLContext | bool = ssl_context or True
        proxy = settings.webhook_proxy_url
        self._proxy, self._proxy_headers = _proxy_parts(None if proxy is None else proxy.get_secret_value())
        # By the checked address a session's connections are pinned to; None for the proxy's.
        self._sessions: OrderedDict[IPAddress | None, aiohttp.ClientSession] = OrderedDict()
        # By the same address: how many requests use its session now.
        self._in_use: Counter[IPAddress | None] = Counter()

    async def __aenter__(self) -> WebhookSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the kept sessions and their connections."""
        sessions, self._sessions = list(self._sessions.values()), OrderedDict()
        for session in sessions:
            await session.close()

    async def run(self, *, stop: asyncio.Event) -> None:
        """Send due deliveries until ``stop`` is set, then let the batches in flight end. A batch is claimed
        every ``relay_poll_seconds`` and as soon as a full one ends, while at most ``MAX_BATCHES_IN_FLIGHT``
        are in flight: a receiver that hangs holds the callbacks of its own batch, not those due after it.
        The database's transient errors (``shared.db.TRANSIENT_DATABASE_ERRORS``, a restart's included)
        pause a batch until the next claim; any other error ends the loop and is raised.
        """
        batches: set[asyncio.Task[int]] = set()
        stopping = asyncio.create_task(stop.wait())
        next_claim = time.monotonic()
        try:
            while not stop.is_set():
                if time.monotonic() >= next_claim and len(batches) < MAX_BATCHES_IN_FLIGHT:
                    batches.add(asyncio.create_task(self.send_due()))
                    next_claim = time.monotonic() + self._settings.relay_poll_seconds
                # With every slot taken, only a batch's end (or the stop) frees one: no timeout to spin on.
                full = len(batches) >= MAX_BATCHES_IN_FLIGHT
                timeout = None if full else max(next_claim - time.monotonic(), 0)
                done, _ = await asyncio.wait({*batches, stopping}, timeout=timeout, return_when=FIRST_COMPLETED)
                # Taken out only once read: an error raised here leaves the rest for the ``finally`` to read.
                if BATCH in [_claimed(batch) for batch in done if batch is not stopping]:
                    next_claim = time.monotonic()
                batches -= done
            if batches:
                await asyncio.wait(batches)
            for batch in batches:
                _claimed(batch)
        finally:
            stopping.cancel()
            await _cancel_all(batches)

    async def send_due(self) -> int:
        """Claim one batch of due deliveries with a lease, send them at once with no database connection
        held, and record each attempt as soon as it ends (with those that ended meanwhile); return how many
        were claimed. While any is still being sent, the batch's lease is extended every
        ``heartbeat_seconds`` (``shared.lease.heartbeating``), under the generation of the claim.
        """
        lease_seconds = self._settings.webhook_timeout_seconds + LEASE_MARGIN_SECONDS
        async with self._pool.acquire() as conn:
            due = await webhook_deliveries.claim_due(conn, limit=BATCH, lease_seconds=lease_seconds)
            # The bodies one by one (one connection runs one statement at a time), then the requests at once.
            bodies = [await self._body(conn, delivery) for delivery in due]
            metrics.WEBHOOK_OLDEST_UNDELIVERED_AGE.set(await webhook_deliveries.oldest_undelivered_age(conn))
        if not due:
            return 0

        async def extend() -> bool:
            async with self._pool.acquire() as conn:
                return await webhook_deliveries.extend(conn, due, lease_seconds=lease_seconds) > 0

        sending = {
            asyncio.create_task(self._attempt(delivery, body)) for delivery, body in zip(due, bodies, strict=True)
        }
        beating = heartbeating(
            extend,
            every_seconds=self._settings.heartbeat_seconds,
            name="webhook-heartbeat",
            log_extra={"webhook_ids": [delivery.webhook_id for delivery in due]},
        )
        try:
            async with beating:
                while sending:
                    ended, sending = await asyncio.wait(sending, return_when=FIRST_COMPLETED)
                    await self._record([attempt.result() for attempt in ended])
        finally:
            await _cancel_all(sending)
        return len(due)

    async def _record(self, attempts: list[Attempt]) -> None:
        """Record ``attempts``, those that ended while the last record was written, in one statement: none
        waits for a receiver still answering.
        """
        try:
            async with self._pool.acquire() as conn:
                recorded = set(await webhook_deliveries.record_attempts(conn, attempts))
        except TRANSIENT_DATABASE_ERRORS as exc:
            # The batch's other requests go on; what is not recorded is due again when its lease ends.
            log.warning("webhook attempts not recorded: the database", extra={"error": type(exc).__name__})
            return
        for attempt in attempts:
            _report(attempt, recorded=attempt.delivery.delivery_id in recorded)

    async def _attempt(self, delivery: Delivery, body: bytes) -> Attempt:
        attempted_at = datetime.now(UTC)
        started = time.monotonic()
        try:
            status_code: int | None = await self._post(delivery, body)
            error = None if webhook_deliveries.is_delivered(status_code) else f"HTTP {status_code}"
        except RefusedTarget as refusal:
            status_code, error = None, f"refused: {refusal}"
        except aiohttp.ClientHttpProxyError as refusal:
            status_code, error = None, f"the proxy answered {refusal.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            status_code, error = None, type(exc).__name__
        duration_ms = int((time.monotonic() - started) * 1000)
        retry = None if error is None else self._retry_seconds(delivery)
        return Attempt(delivery, attempted_at, status_code, duration_ms, error, retry)

    async def _body(self, conn: asyncpg.Connection, delivery: Delivery) -> bytes:
        data = await _subject(conn, delivery)
        message = {
            "type": delivery.event_type,
            "timestamp": datetime.now(UTC).isoformat(),
            "data": data,
            PAYLOAD_VERSION_FIELD: PAYLOAD_VERSION,
        }
        return jsontext.dumps(message).encode()

    async def _post(self, delivery: Delivery, body: bytes) -> int:
        target = check_url(delivery.url, allow_private=self._settings.webhook_allow_private)
        # One deadline for the whole attempt, from resolving the name through the TLS handshake to the last
        # byte read (docs/api.md: Completion callbacks); aiohttp's own would start after the lookup.
        # A span of our own, in the trace of what the callback reports: the aiohttp client instrumentation
        # would record the URL's query, which may hold the receiver's secret (docs/monitoring.md: Monitoring, Traces).
        with tracing.span(
            "callback POST",
            parent=delivery.traceparent,
            client=True,
            attributes=_callback_attributes(delivery, target),
        ):
            headers = self._headers(delivery, body)
            tracing.inject(headers)
            async with asyncio.timeout(self._settings.webhook_timeout_seconds):
                async with self._session(target) as session:
                    connection = _Connection()
                    try:
                        return await self._send(session, target, body, headers, connection)
                    except aiohttp.ServerDisconnectedError:
                        # A kept connection the receiver closed as the request went out, before any answer:
                        # aiohttp does not send a POST again. Once more, within the same deadline; a new
                        # connection closed unanswered is the receiver's answer, and the attempt's error.
                        if not connection.reused:
                            raise
                        return await self._send(session, target, body, headers, _Connection())

    async def _send(
        self,
        session: aiohttp.ClientSession,
        target: Target,
        body: bytes,
        headers: dict[str, str],
        connection: _Connection,
    ) -> int:
        """POST ``body`` once; the answer's status, its first ``MAX_ANSWER_BYTES`` read and dropped.
        ``connection`` learns whether the request went on a kept connection.
        """
        async with session.post(
            target.request_url,
            data=body,
            trace_request_ctx=connection,
            headers=headers,
            allow_redirects=False,
            ssl=self._ssl,
            proxy=self._proxy,
            proxy_headers=self._proxy_headers,
        ) as response:
            await response.content.read(MAX_ANSWER_BYTES)
            tracing.set_attributes(**{"http.response.status_code": response.status})
            return response.status

    @contextlib.asynccontextmanager
    async def _session(self, target: Target) -> AsyncIterator[aiohttp.ClientSession]:
        """The session for ``target`` while a request uses it: through the proxy, the one whose connector
        resolves only the proxy's own name; else the one pinned to the target's checked address, resolved
        here for a name. Sessions are kept, so a receiver's connection is reused where it allows keep-alive;
        beyond ``MAX_SESSIONS`` the least recently used idle ones are closed, never one a request still uses.
        """
        address = None
        if self._proxy is None:
            address = target.address
            if address is None:
                addresses = await self._resolve(target.host, target.port)
                address = check_addresses(addresses, allow_private=self._settings.webhook_allow_private)
        session = self._sessions.pop(address, None) or _new_session(address)
        self._sessions[address] = session
        self._in_use[address] += 1
        try:
            await self._close_idle_sessions()
            yield session
        finally:
            self._in_use[address] -= 1
            if not self._in_use[address]:
                del self._in_use[address]

    async def _close_idle_sessions(self) -> None:
        """Close the least recently used sessions no request uses, as many as there are beyond ``MAX_SESSIONS``;
        taken out of the table first, so that no request picks one up while it closes.
        """
        idle = [address for address in self._sessions if not self._in_use[address]]
        excess = max(len(self._sessions) - MAX_SESSIONS, 0)
        closing = [self._sessions.pop(address) for address in idle[:excess]]
        for session in closing:
            await session.close()

    def _headers(self, delivery: Delivery, body: bytes) -> dict[str, str]:
        timestamp = int(time.time())
        secrets = [user_secret(key, delivery.owner_id) for key in self._keys]
        return {
            "Content-Type": "application/json",
            "webhook-id": delivery.webhook_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signature_header(
                secrets, webhook_id=delivery.webhook_id, timestamp=timestamp, body=body
            ),
        }

    def _retry_seconds(self, delivery: Delivery) -> float | None:
        """Exponential backoff with full jitter; None once the next try would fall after the retry time."""
        ceiling = min(self._settings.webhook_first_retry_seconds * 2**delivery.attempts, MAX_RETRY_SECONDS)
        delay = random.uniform(ceiling / 2, ceiling)
        return None if delivery.age_seconds + delay > self._settings.webhook_retry_seconds else delay


def _claimed(batch: asyncio.Task[int]) -> int:
    """How many deliveries ``batch``, a ``send_due`` that ended, claimed; 0 after a transient error of the
    database, which is logged. Raises any other error of the batch.
    """
    try:
        return batch.result()
    except TRANSIENT_DATABASE_ERRORS as exc:
        log.warning("webhook deliveries paused by the database", extra={"error": type(exc).__name__})
        return 0


async def _cancel_all(tasks: set[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until each has ended, so that none outlives what it uses (the sessions, the
    pool); their errors are dropped, as cancelled work's.
    """
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _report(attempt: Attempt, *, recorded: bool) -> None:
    """Count and log one attempt; one whose delivery was claimed again meanwhile was not recorded."""
    if not recorded:
        log.warning("webhook attempt not recorded: claimed again", extra={"webhook_id": attempt.delivery.webhook_id})
        return
    outcome = "delivered" if attempt.delivered else "retried" if attempt.retry_seconds is not None else "gave_up"
    metrics.WEBHOOK_DELIVERIES.labels(outcome).inc()
    log.info(
        "webhook attempt",
        extra={
            "webhook_id": attempt.delivery.webhook_id,
            "host": urlsplit(attempt.delivery.url).hostname,
            "status": attempt.status_code,
            "outcome": outcome,
            "error": attempt.error,
        },
    )


def _callback_attributes(delivery: Delivery, target: Target) -> dict[str, str | int]:
    """A callback span's attributes: what it reports, and where it goes without the URL's path or query."""
    subject = (
        {tracing.OPERATION_ID: delivery.operation_id}
        if delivery.operation_id
        else {tracing.SCHEDULE_ID: delivery.schedule_id or ""}
    )
    return {
        **subject,
        "http.request.method": "POST",
        "server.address": target.host,
        "server.port": target.port,
        "chatexport.webhook_id": delivery.webhook_id,
    }


async def _subject(conn: asyncpg.Connection, delivery: Delivery) -> dict[str, Any]:
    """What the event reports, as its owner reads it now: the schedule of a ``schedule.paused``
    (docs/schedules.md: When a run cannot go on), else the operation; only its id once it is gone.
    """
    if delivery.schedule_id is not None:
        schedule = await schedules.read_schedule(conn, schedule_id=delivery.schedule_id, owner_id=delivery.owner_id)
        return represent_schedule(schedule) if schedule is not None else {"schedule_id": delivery.schedule_id}
    assert delivery.operation_id is not None  # a delivery names exactly one subject (migration 0013)
    row = await status_monitor.read_operation(conn, operation_id=delivery.operation_id, owner_id=None)
    return represent(row) if row is not None else {"operation_id": delivery.operation_id}


async def resolve_host(host: str, port: int) -> list[str]:
    """Every address the system's resolver gives for ``host``; ``RefusedTarget`` when it gives none."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise RefusedTarget("the host name does not resolve") from None
    return [str(info[4][0]) for info in infos]


def _proxy_parts(url: str | None) -> tuple[URL | None, dict[str, str] | None]:
    """The proxy's URL without its credentials, and the ``Proxy-Authorization`` header they make: kept apart,
    no error that names the proxy's URL can carry the password.
    """
    if url is None:
        return None, None
    proxy = URL(url)
    if proxy.user is None:
        return proxy, None
    return proxy.with_user(None), {"Proxy-Authorization": aiohttp.encode_basic_auth(proxy.user, proxy.password or "")}
