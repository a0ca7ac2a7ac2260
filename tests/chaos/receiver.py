"""The fault harness's callback receiver: a local HTTP server that records each callback's ``webhook-id`` per
operation (or schedule) and can be made to refuse connections, answer slowly or answer 500.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

from aiohttp import web

from devtools.ports import free_port

# A slow answer takes longer than the harness's callback timeout, so the relay counts it as failed.
SLOW_SECONDS = 2.0


class Receiver:
    """Callbacks as they arrive: ``received[operation_id]`` (``received[schedule_id]`` for a schedule's own
    callback) is the set of ``webhook-id`` values accepted with a 2xx. ``mode`` is ``"up"``, ``"slow"`` or
    ``"errors"``; ``down()``/``up()`` close and reopen the listening socket on the same port.
    """

    def __init__(self) -> None:
        self.received: defaultdict[str, set[str]] = defaultdict(set)
        self.mode = "up"
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    @property
    def url(self) -> str:
        """Where callbacks go: an http URL on 127.0.0.1, allowed by the harness's settings."""
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> None:
        """Listen on a free port below the ephemeral range (kept for later ``up()`` calls): a port the kernel
        hands out may be an outgoing connection's by the time ``down()`` ends.
        """
        self.port = free_port()
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        await self.up()

    async def up(self) -> None:
        """Answer callbacks normally again, listening if ``down()`` stopped it."""
        self.mode = "up"
        if self._site is None:
            assert self._runner is not None
            self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
            await self._site.start()
            self.port = self._runner.addresses[0][1]

    async def down(self) -> None:
        """Stop listening: callbacks meet a refused connection."""
        if self._site is not None:
            await self._site.stop()
            self._site = None

    async def close(self) -> None:
        """Stop the server for good."""
        if self._runner is not None:
            await self._runner.cleanup()

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.mode == "slow":
            await asyncio.sleep(SLOW_SECONDS)  # the fault itself: an answer later than the sender waits
        if self.mode == "errors":
            return web.Response(status=500)
        data = json.loads(body)["data"]
        subject = data["operation_id"] if "operation_id" in data else data["schedule_id"]
        self.received[subject].add(request.headers["webhook-id"])
        return web.Response(status=204)
