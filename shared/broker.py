"""RabbitMQ topology and connections (docs/architecture.md: How it works).

A message is only a wake-up: ``{"operation_id": ...}`` on a durable quorum queue with a dead-letter
exchange. Postgres decides what happens; a lost or duplicated message may delay work but never changes an
outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aio_pika
import aiohttp
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractQueue,
    AbstractRobustConnection,
    UnderlayConnection,
)
from yarl import URL

from shared.lifecycle import keep_trying
from shared.settings import BrokerSettings, amqp_node_urls

log = logging.getLogger(__name__)

EXPORT_ROUTING_KEY = "export.run"
# A chunk's wake-up, ``{"operation_id": ..., "chunk": n}``, on a queue of its own (docs/chunks.md: Chunked
# exports): a worker of an earlier release, which reads only ``operation_id``, never consumes it, and a small
# export never waits behind queued chunks.
CHUNK_ROUTING_KEY = "export.chunk"
# A question to the management API that takes longer is given up (the member check tries again later).
MANAGEMENT_TIMEOUT_SECONDS = 5.0
# What connecting to an unreachable or overloaded broker raises.
CONNECT_ERRORS: tuple[type[BaseException], ...] = (aio_pika.exceptions.AMQPConnectionError, OSError, TimeoutError)
# What the first steps on a new connection raise when the broker goes away under them: aiormq reports a
# channel asked of a connection closed meanwhile as RuntimeError ("<Connection ...> closed").
START_ERRORS: tuple[type[BaseException], ...] = (
    *CONNECT_ERRORS,
    aio_pika.exceptions.ConnectionClosed,
    aio_pika.exceptions.ChannelInvalidStateError,
    RuntimeError,
)


def dead_letter_exchange_name(settings: BrokerSettings) -> str:
    """The dead-letter exchange of the work queue: ``<exchange>.dlx``."""
    return f"{settings.amqp_exchange}.dlx"


def chunk_queue_name(settings: BrokerSettings) -> str:
    """The chunk queue: ``<queue>.chunks``."""
    return f"{settings.amqp_queue}.chunks"


def node_label(url: URL) -> str:
    """A node's URL for logs: scheme, host, port and virtual host, never its credentials or query."""
    return str(url.with_user(None).with_query(None))


class NodeRotatingConnection(aio_pika.RobustConnection):
    """A robust connection to a cluster: each reconnection attempt goes to the node after the one before,
    round the list, so a connection whose node went (or an attempt that failed) moves on to another node.
    Channels, queues, exchanges and consumers still referenced are restored there, as after any reconnect.

    ``nodes`` are the node URLs (the same query, e.g. ``heartbeat``, on each); the first attempt goes to
    ``nodes[0]``.
    """

    # aio-pika 10's reconnect loop clears ``transport`` before every attempt, then connects to ``self.url``;
    # it has no other hook between attempts. Turning the attribute into a property lets us pick the node
    # there. ``Connection.__init__`` (before ``_nodes`` exists) and ``close`` (once ``_close_called`` is set)
    # clear it too; neither moves the node.
    _transport: UnderlayConnection | None = None

    def __init__(self, nodes: Sequence[URL], **kwargs: Any) -> None:
        super().__init__(nodes[0], **kwargs)
        self._nodes = itertools.cycle(nodes)

    @property
    def transport(self) -> UnderlayConnection | None:
        return self._transport

    @transport.setter
    def transport(self, value: UnderlayConnection | None) -> None:
        if value is None and hasattr(self, "_nodes") and not self._close_called:
            self.url = next(self._nodes)
        self._transport = value

    async def _on_connected(self) -> None:
        await super()._on_connected()
        name = self.kwargs.get("client_properties", {}).get("connection_name")
        log.info("broker connected", extra={"node": node_label(self.url), "connection": name})


def node_urls(settings: BrokerSettings) -> list[URL]:
    """The node URLs of ``amqp_url``, each asking for heartbeats every ``amqp_heartbeat_seconds``."""
    return [
        URL(url).update_query(heartbeat=settings.amqp_heartbeat_seconds) for url in amqp_node_urls(settings.amqp_url)
    ]


def dead_queue_name(settings: BrokerSettings) -> str:
    """The dead-letter queue: ``<queue>.dead``."""
    return f"{settings.amqp_queue}.dead"


def queue_names(settings: BrokerSettings) -> tuple[str, str, str]:
    """The quorum queues ``declare_topology`` declares: work, chunk and dead-letter queue."""
    return settings.amqp_queue, chunk_queue_name(settings), dead_queue_name(settings)


def quorum_arguments(settings: BrokerSettings) -> dict[str, Any]:
    """The arguments every quorum queue of ours is declared with: ``x-queue-type``, and
    ``x-quorum-initial-group-size`` only when ``amqp_quorum_initial_group_size`` is set (RabbitMQ refuses a
    redeclaration that adds, drops or changes it: docs/deploy.md: Broker clusters).
    """
    arguments: dict[str, Any] = {"x-queue-type": "quorum"}
    if settings.amqp_quorum_initial_group_size is not None:
        arguments["x-quorum-initial-group-size"] = settings.amqp_quorum_initial_group_size
    return arguments


async def connect(settings: BrokerSettings, *, name: str) -> AbstractRobustConnection:
    """Open a robust connection named ``name`` (shown in the broker's management UI) to the first node of
    ``amqp_url`` that answers, each tried for ``amqp_connect_timeout_seconds`` in turn; when that node goes
    later, the connection reconnects to the next ones (``NodeRotatingConnection``; docs/deploy.md: Broker
    clusters).

    Heartbeats every ``amqp_heartbeat_seconds``: a broker that stops answering without closing the
    connection is noticed after two or three of them (readiness turns 503, and the connection reconnects),
    rather than after RabbitMQ's default of a minute each.

    Raises what the last node's attempt raised (``CONNECT_ERRORS``) when no node answers.
    """
    nodes = node_urls(settings)
    # A robust connection gives up on its first attempt, so the first node that answers is found here.
    for start in range(len(nodes) - 1):
        try:
            return await _connect_from(nodes, start, settings, name=name)
        except CONNECT_ERRORS as exc:
            log.warning(
                "broker node unavailable; trying the next",
                extra={"node": node_label(nodes[start]), "error": type(exc).__name__},
            )
    return await _connect_from(nodes, len(nodes) - 1, settings, name=name)


async def _connect_from(nodes: list[URL], start: int, settings: BrokerSettings, *, name: str) -> NodeRotatingConnection:
    """A ``NodeRotatingConnection`` whose first attempt goes to ``nodes[start]``; closed again when it fails."""
    connection = NodeRotatingConnection([*nodes[start:], *nodes[:start]], client_properties={"connection_name": name})
    try:
        await connection.connect(timeout=settings.amqp_connect_timeout_seconds)
    except BaseException:
        await connection.close()
        raise
    return connection


@dataclass(frozen=True)
class BrokerSession:
    """A part's broker resources: its robust ``connection``, the one ``channel`` it opened on it, and the work
    ``exchange``, ``queue`` and ``chunk_queue`` declared through that channel (which lives as long as they do).
    """

    connection: AbstractRobustConnection
    channel: AbstractChannel
    exchange: AbstractExchange
    queue: AbstractQueue
    chunk_queue: AbstractQueue


async def open_session(
    settings: BrokerSettings, *, name: str, prefetch_count: int | None = None, on_return_raises: bool = False
) -> BrokerSession:
    """``connect``, open a channel with publisher confirms (``on_return_raises``: an unroutable publish
    raises; ``prefetch_count``: at most that many unacknowledged deliveries) and ``declare_topology``. The
    connection is closed again when a later step fails, with ``START_ERRORS`` when the broker went away.
    """
    connection = await connect(settings, name=name)
    try:
        channel = await connection.channel(on_return_raises=on_return_raises)
        if prefetch_count is not None:
            await channel.set_qos(prefetch_count=prefetch_count)
        exchange, queue, chunk_queue = await declare_topology(channel, settings)
    except BaseException:
        with contextlib.suppress(Exception):
            await connection.close()
        raise
    return BrokerSession(connection, channel, exchange, queue, chunk_queue)


async def open_session_when_ready(
    settings: BrokerSettings,
    *,
    name: str,
    stop: asyncio.Event,
    prefetch_count: int | None = None,
    on_return_raises: bool = False,
) -> BrokerSession:
    """``open_session``, retried with backoff until every step of it succeeds: a broker that goes away between
    the connection and the topology is waited for like one that was not up yet. Raises ``Stopped`` on
    ``stop``.
    """
    return await keep_trying(
        lambda: open_session(settings, name=name, prefetch_count=prefetch_count, on_return_raises=on_return_raises),
        what="broker",
        errors=START_ERRORS,
        stop=stop,
    )


async def declare_topology(
    channel: AbstractChannel, settings: BrokerSettings
) -> tuple[AbstractExchange, AbstractQueue, AbstractQueue]:
    """Declare the work exchange, the quorum work and chunk queues and their dead-letter queue; return
    (exchange, work queue, chunk queue).

    Idempotent: every part may call it on start-up. Over ``amqp_delivery_limit`` redeliveries a message is
    dead-lettered rather than dropped (a quorum queue drops what it cannot dead-letter).
    """
    dlx_name = dead_letter_exchange_name(settings)
    dlx = await channel.declare_exchange(dlx_name, aio_pika.ExchangeType.FANOUT, durable=True)
    dead = await channel.declare_queue(dead_queue_name(settings), durable=True, arguments=quorum_arguments(settings))
    await dead.bind(dlx)
    exchange = await channel.declare_exchange(settings.amqp_exchange, aio_pika.ExchangeType.DIRECT, durable=True)
    arguments: dict[str, Any] = {
        **quorum_arguments(settings),
        "x-dead-letter-exchange": dlx_name,
        "x-delivery-limit": settings.amqp_delivery_limit,
    }
    queue = await channel.declare_queue(settings.amqp_queue, durable=True, arguments=arguments)
    await queue.bind(exchange, routing_key=EXPORT_ROUTING_KEY)
    chunks = await channel.declare_queue(chunk_queue_name(settings), durable=True, arguments=arguments)
    await chunks.bind(exchange, routing_key=CHUNK_ROUTING_KEY)
    return exchange, queue, chunks


class MembersUnknown(Exception):
    """The management API answered, but not with a quorum queue's member list."""


async def queue_members(settings: BrokerSettings, queue: str) -> list[str]:
    """The nodes holding a replica of the quorum queue ``queue`` (in the virtual host of ``amqp_url``), as
    the management API at ``amqp_management_url`` lists them (``GET /api/queues/{vhost}/{name}``); AMQP
    cannot tell them (docs/deploy.md: Broker clusters).

    Raises ``ValueError`` when ``amqp_management_url`` is unset, ``aiohttp.ClientError`` (a 404 for a missing
    queue, a 401 for wrong credentials, a refused connection) or ``TimeoutError`` after
    ``MANAGEMENT_TIMEOUT_SECONDS``, and ``MembersUnknown`` when the queue has no member list (not quorum).
    """
    if settings.amqp_management_url is None:
        raise ValueError("amqp_management_url is not set")
    base = URL(settings.amqp_management_url.get_secret_value())
    headers = {"Authorization": aiohttp.encode_basic_auth(base.user, base.password or "")} if base.user else {}
    # The virtual host's name is the AMQP URL's path without its first slash; "/" when that leaves nothing.
    vhost = URL(amqp_node_urls(settings.amqp_url)[0]).path[1:] or "/"
    path = f"api/queues/{quote(vhost, safe='')}/{quote(queue, safe='')}"
    url = URL(f"{str(base.with_user(None)).rstrip('/')}/{path}", encoded=True)
    timeout = aiohttp.ClientTimeout(total=MANAGEMENT_TIMEOUT_SECONDS)
    async with (
        aiohttp.ClientSession(timeout=timeout, headers=headers) as session,
        session.get(url, raise_for_status=True) as response,
    ):
        body = await response.json()
    members = body.get("members") if isinstance(body, dict) else None
    if not isinstance(members, list):
        raise MembersUnknown(queue)
    return [str(member) for member in members]
