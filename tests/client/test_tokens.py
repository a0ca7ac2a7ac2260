"""The client's token command (docs/command-line.md: Tokens): run when the token is missing, about to expire or
refused, once for every request waiting on it, within its deadline."""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from pathlib import Path

import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from chatexport.client.api import Api
from chatexport.client.tokens import Tokens, TokenUnavailable


def command_printing(tmp_path: Path, *tokens: str) -> str:
    """A token command that prints ``tokens`` in turn, one per run (the last one again after them)."""
    (tmp_path / "runs").write_text("0")
    script = tmp_path / "token_command.py"
    script.write_text(
        "import pathlib, sys\n"
        f"runs = pathlib.Path({str(tmp_path / 'runs')!r})\n"
        "n = int(runs.read_text())\n"
        "runs.write_text(str(n + 1))\n"
        f"tokens = {list(tokens)!r}\n"
        "print(tokens[min(n, len(tokens) - 1)])\n"
    )
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def runs(tmp_path: Path) -> int:
    return int((tmp_path / "runs").read_text())


def api_accepting(accepted: set[str], seen: list[str]) -> web.Application:
    async def operations(request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        seen.append(token)
        if token not in accepted:
            return web.json_response({"code": "UNAUTHENTICATED", "detail": "no"}, status=401)
        return web.json_response({"operations": []})

    app = web.Application()
    app.router.add_get("/v3/operations", operations)
    return app


async def test_a_refused_token_is_renewed_once_and_the_request_sent_again(tmp_path: Path) -> None:
    seen: list[str] = []
    tokens = Tokens("old-token", command=command_printing(tmp_path, "new-token"))
    async with TestServer(api_accepting({"new-token"}, seen)) as server, Api(str(server.make_url("")), tokens) as api:
        assert await asyncio.gather(*(api.operations() for _ in range(5))) == [[]] * 5
        assert await api.operations() == []
    assert runs(tmp_path) == 1  # five requests refused at once, one run of the command
    assert seen.count("old-token") == 5 and seen.count("new-token") == 6


async def test_the_command_gives_the_first_token_and_renews_one_about_to_expire(tmp_path: Path) -> None:
    soon = jwt.encode({"sub": "alice", "exp": int(time.time()) + 5}, "k" * 32)
    later = jwt.encode({"sub": "alice", "exp": int(time.time()) + 3600}, "k" * 32)
    seen: list[str] = []
    tokens = Tokens(None, command=command_printing(tmp_path, soon, later))
    async with TestServer(api_accepting({soon, later}, seen)) as server, Api(str(server.make_url("")), tokens) as api:
        await api.operations()
        await api.operations()
    assert seen == [soon, later]  # the first token expires within the margin: renewed before the next request
    assert runs(tmp_path) == 2


async def test_without_a_command_a_refusal_is_the_apis_answer() -> None:
    seen: list[str] = []
    async with TestServer(api_accepting(set(), seen)) as server, Api(str(server.make_url("")), "old") as api:
        with pytest.raises(Exception, match="UNAUTHENTICATED"):
            await api.operations()
    assert seen == ["old"]


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (f"{shlex.quote(sys.executable)} -c 'import time; time.sleep(30)'", "no token within 0.5 s"),
        (f"{shlex.quote(sys.executable)} -c 'import sys; sys.exit(3)'", r"failed \(exit 3\)"),
        ("/nonexistent/token-helper", "cannot be run"),
    ],
)
async def test_a_command_that_fails_says_so_without_a_token(command: str, message: str) -> None:
    with pytest.raises(TokenUnavailable, match=message):
        await Tokens(None, command=command, timeout_seconds=0.5).current()


async def test_a_command_that_leaves_a_program_behind_still_gives_its_token() -> None:
    # The background sleep keeps the output pipe open long after the command printed its token and exited.
    tokens = Tokens(None, command="sh -c 'sleep 30 & echo tok-123'", timeout_seconds=10)
    assert await asyncio.wait_for(tokens.current(), 5) == "tok-123"


async def test_a_command_that_prints_too_much_gives_no_token() -> None:
    with pytest.raises(TokenUnavailable):
        await Tokens(None, command=f"{shlex.quote(sys.executable)} -c 'print(\"x\" * 1_000_000)'").current()
