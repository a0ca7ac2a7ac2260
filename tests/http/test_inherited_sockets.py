"""The API and a part's monitoring endpoint serve on listening sockets they inherit (``api_socket_fd``,
``metrics_socket_fd``; docs/deploy.md: Deployment and scaling)."""

from __future__ import annotations

import asyncio
import os
import socket

import aiohttp

from services.api.app import listening
from shared.settings import Settings


async def test_the_api_and_its_monitoring_serve_on_the_sockets_they_inherit(settings: Settings) -> None:
    with socket.create_server(("127.0.0.1", 0)) as api, socket.create_server(("127.0.0.1", 0)) as monitoring:
        api_port, monitoring_port = api.getsockname()[1], monitoring.getsockname()[1]
        # The same ports as the sockets: were the API to bind them itself, it would fail (address in use).
        served = settings.model_copy(
            update={
                "api_port": api_port,
                "api_socket_fd": os.dup(api.fileno()),
                "metrics_port": monitoring_port,
                "metrics_socket_fd": os.dup(monitoring.fileno()),
            }
        )
        async with listening(served) as runner, aiohttp.ClientSession() as http:
            assert [address[1] for address in runner.addresses] == [api_port]
            for port in (api_port, monitoring_port):
                async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                    assert response.status == 200, port
        # Stopped, the API closed only its copy: the port is still held, and a client waits instead of
        # being refused, as it would while a supervisor restarts the API.
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", api_port), 5)
        writer.close()
