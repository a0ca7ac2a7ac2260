"""What a completion callback meets on its way, for the tests of the relay's sender: a receiver (plain or
over TLS with a certificate made here), one that trickles its answer, and a small CONNECT proxy whose rules
are a table of names.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiohttp import encode_basic_auth, web

from services.relay.webhooks import WebhookSender
from shared.settings import Settings


@dataclass
class Receiver:
    """A local callback receiver: what it got, and the status it answers with; with ``release``, each answer
    waits until that event is set.
    """

    url: str = ""
    status: int = 200
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    release: asyncio.Event | None = None
    # The client's (address, port) of each request, in order: one port for requests on one connection.
    peers: list[tuple[str, int]] = field(default_factory=list)


async def send_due(pool: asyncpg.Pool, settings: Settings, **options: Any) -> int:
    """One batch of a new ``WebhookSender`` (``options`` its keyword arguments), closed afterwards; returns
    how many deliveries it claimed.
    """
    async with WebhookSender(pool=pool, settings=settings, **options) as sender:
        return await sender.send_due()


@contextlib.asynccontextmanager
async def listening(
    receiver: Receiver, *, ssl_context: ssl.SSLContext | None = None, host: str = "127.0.0.1"
) -> AsyncIterator[int]:
    """Serve ``receiver`` at ``/hook`` on a free port of ``host``, a loopback address (over TLS with
    ``ssl_context``), for the block; yield the port.
    """

    async def hook(request: web.Request) -> web.Response:
        receiver.received.append((dict(request.headers), await request.read()))
        assert request.transport is not None
        receiver.peers.append(request.transport.get_extra_info("peername")[:2])
        if receiver.release is not None:
            await receiver.release.wait()
        return web.Response(status=receiver.status)

    app = web.Application()
    app.router.add_post("/hook", hook)
    async with serving(app, ssl_context=ssl_context, host=host) as port:
        yield port


@contextlib.asynccontextmanager
async def serving(
    app: web.Application, *, ssl_context: ssl.SSLContext | None = None, host: str = "127.0.0.1"
) -> AsyncIterator[int]:
    """Serve ``app`` on a free port of ``host`` (over TLS with ``ssl_context``) for the block; yield the port."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, 0, ssl_context=ssl_context).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def garbling() -> AsyncIterator[int]:
    """A receiver on a free port of 127.0.0.1 that answers every request's head with bytes that are not
    HTTP, then closes; yields the port.
    """

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"THIS IS NOT HTTP\r\n\r\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def trickling() -> AsyncIterator[int]:
    """A receiver on a free port of 127.0.0.1 that, once it has a request's head, answers one byte every
    50 ms and never ends its headers (nor a TLS handshake, which never sends such a head); yields the port.
    """
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        handlers.add(handler)
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nX-Trickle: ")
            while not writer.is_closing():
                writer.write(b".")
                await writer.drain()
                await asyncio.sleep(0.05)  # the trickle itself, not a wait for anything
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client gave up
        finally:
            writer.close()
            handlers.discard(handler)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


class ConnectProxy:
    """A CONNECT proxy (RFC 9110, section 9.3.6) on 127.0.0.1: it wants Basic credentials ``user`` and
    ``password`` (else 407), tunnels a host named in ``routes`` to that local port whatever port was asked
    for, and refuses anything else with 403. ``requests`` holds each request's line and its
    Proxy-Authorization header.
    """

    def __init__(self, routes: dict[str, int], *, user: str, password: str) -> None:
        self.routes = routes
        self.user, self.password = user, password
        self.requests: list[tuple[str, str | None]] = []
        self._handlers: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        """The proxy's URL, credentials included."""
        return f"http://{self.user}:{self.password}@127.0.0.1:{self.port}"

    async def __aenter__(self) -> ConnectProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        self._server.close()
        for handler in self._handlers:
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            headers = {
                name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in head[1:])
            }
            self.requests.append((head[0], headers.get("proxy-authorization")))
            method, authority, _ = head[0].split(" ")
            if headers.get("proxy-authorization") != encode_basic_auth(self.user, self.password):
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
            elif method != "CONNECT" or authority.rpartition(":")[0] not in self.routes:
                writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            else:
                await self._tunnel(reader, writer, self.routes[authority.rpartition(":")[0]])
            await writer.drain()
        finally:
            writer.close()
            self._handlers.discard(handler)

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        finally:
            upstream_writer.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy ``source`` to ``sink`` until ``source`` ends, then close ``sink``."""
    while data := await source.read(65536):
        sink.write(data)
        await sink.drain()
    sink.close()
