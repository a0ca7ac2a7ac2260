"""An HTTP proxy that records each request it forwards: in front of the S3 emulator, which checks neither
signatures nor expiry, so what a client sends to the storage is checked here; or in front of the API.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

# Hop-by-hop and framing headers, which the proxy's own connections set.
_NOT_FORWARDED = frozenset({"host", "content-length", "transfer-encoding", "connection"})


@dataclass(frozen=True)
class Recorded:
    """One forwarded request: its method, path, query and headers as the client sent them."""

    method: str
    path: str
    query: dict[str, str]
    headers: CIMultiDict[str]


class StorageProxy:
    """Forwards every request to ``upstream`` (the emulator's base URL) and records it in ``requests``; its
    own base URL is ``url`` once ``start`` has run.
    """

    def __init__(self, upstream: str) -> None:
        self._upstream = upstream.rstrip("/")
        self.requests: list[Recorded] = []
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def start(self) -> None:
        """Listen on a free local port."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self._session = aiohttp.ClientSession(auto_decompress=False)

    async def close(self) -> None:
        """Stop listening and close the upstream session."""
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        self.requests.append(Recorded(request.method, request.path, dict(request.query), CIMultiDict(request.headers)))
        headers = {name: value for name, value in request.headers.items() if name.lower() not in _NOT_FORWARDED}
        async with self._session.request(
            request.method,
            self._upstream + request.path_qs,
            headers=headers,
            data=await request.read(),
            allow_redirects=False,
        ) as upstream:
            body = await upstream.read()
            answer = {name: value for name, value in upstream.headers.items() if name.lower() not in _NOT_FORWARDED}
        return await self._respond(request, upstream.status, body, answer)

    async def _respond(
        self, request: web.Request, status: int, body: bytes, headers: dict[str, str]
    ) -> web.StreamResponse:
        """The answer to ``request``: the upstream's as it came; a subclass may cut it."""
        return web.Response(status=status, body=body, headers=headers)
