"""The command-line client's own output (docs/command-line.md: Command-line client): a reader that stops early, as
``chatexport operations show OP | head`` does, is no error.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

from aiohttp import web
from aiohttp.test_utils import TestServer


async def test_a_reader_that_stops_reading_is_no_error() -> None:
    async def operation(request: web.Request) -> web.Response:
        return web.json_response({"operation_id": request.match_info["id"], "state": "SUCCEEDED"})

    app = web.Application()
    app.router.add_get("/v3/operations/{id}", operation)
    async with TestServer(app) as server:
        command = [sys.executable, "-m", "chatexport.cli", "operations", "show", "op_x"]
        command += ["--api", str(server.make_url("")).rstrip("/"), "--token", "t"]

        def run_with_a_closed_reader() -> tuple[int, bytes]:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert process.stdout is not None and process.stderr is not None
            process.stdout.close()  # the reader is gone before the first line is written
            errors = process.stderr.read()
            return process.wait(timeout=60), errors

        code, errors = await asyncio.to_thread(run_with_a_closed_reader)

    assert (code, errors) == (0, b"")
