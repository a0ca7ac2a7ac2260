"""Where the client's bearer token comes from (docs/command-line.md: Tokens): ``CHATEXPORT_TOKEN`` (or
``--token``), or a command that prints one (``CHATEXPORT_TOKEN_COMMAND``), run when the token is missing,
about to expire or refused with a 401, as ``kubectl`` and ``gh`` run their credential helpers. Every request
of the API session carries the token through ``Tokens.authorize``, an aiohttp client middleware, so that a
long ``fetch`` or ``export`` outlives a token.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shlex
import tempfile
import time
from collections.abc import Callable

from aiohttp import ClientHandlerType, ClientRequest, ClientResponse

# A token this close to its exp is renewed before it is sent, so that it does not expire in flight.
RENEW_BEFORE_EXP_SECONDS = 30.0
# The default deadline of the token command (CHATEXPORT_TOKEN_COMMAND_TIMEOUT_SECONDS).
COMMAND_TIMEOUT_SECONDS = 30.0
# The most a token command may print: real access tokens are a few KiB.
MAX_TOKEN_BYTES = 64 * 1024


class TokenUnavailable(Exception):
    """No token, and no command, or a command that failed; the message says which, never the token."""


class Tokens:
    """The bearer token of a session: ``token`` as given, renewed by running ``command`` (split as a shell
    splits it, run without one; its stdout, stripped, is the token) within ``timeout_seconds``.
    """

    def __init__(
        self,
        token: str | None,
        *,
        command: str | None = None,
        timeout_seconds: float = COMMAND_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._token = token or None
        self._command = shlex.split(command) if command else None
        self._timeout = timeout_seconds
        self._clock = clock
        self._renewing = asyncio.Lock()

    async def current(self) -> str:
        """The token to send: renewed first when there is none or it expires within
        ``RENEW_BEFORE_EXP_SECONDS`` and a command is set. Raises ``TokenUnavailable``.
        """
        if self._token is None or (self._command and self._expiring(self._token)):
            return await self.renew(self._token)
        return self._token

    async def renew(self, refused: str | None) -> str:
        """A new token from the command, unless another request renewed ``refused`` meanwhile (one run for
        them all). Raises ``TokenUnavailable`` without a command or when it fails.
        """
        async with self._renewing:
            if self._token is not None and self._token != refused:
                return self._token
            if not self._command:
                raise TokenUnavailable("no token: pass --token, set CHATEXPORT_TOKEN or CHATEXPORT_TOKEN_COMMAND")
            self._token = await self._run()
            return self._token

    async def authorize(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        """The client middleware: send ``request`` with the token; on a 401 with a command, renew the token
        and send it once more.
        """
        sent = await self.current()
        request.headers["Authorization"] = f"Bearer {sent}"
        response = await handler(request)
        if response.status != 401 or not self._command:
            return response
        response.release()
        request.headers["Authorization"] = f"Bearer {await self.renew(sent)}"
        return await handler(request)

    async def _run(self) -> str:
        """The token the command prints (at most ``MAX_TOKEN_BYTES`` read). Its output goes to a temporary
        file, not a pipe: a program it leaves running may hold its output open, and the command's end is
        what counts.
        """
        assert self._command is not None
        with tempfile.TemporaryFile() as output:
            try:
                process = await asyncio.create_subprocess_exec(
                    *self._command, stdin=asyncio.subprocess.DEVNULL, stdout=output
                )
            except OSError as exc:
                raise TokenUnavailable(f"the token command cannot be run ({type(exc).__name__})") from None
            try:
                async with asyncio.timeout(self._timeout):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
                raise TokenUnavailable(f"the token command gave no token within {self._timeout:g} s") from None
            output.seek(0)
            printed = output.read(MAX_TOKEN_BYTES + 1)
        token = printed.decode(errors="replace").strip()
        if process.returncode != 0 or not token or len(printed) > MAX_TOKEN_BYTES or any(c.isspace() for c in token):
            raise TokenUnavailable(f"the token command failed (exit {process.returncode}) or printed no token")
        return token

    def _expiring(self, token: str) -> bool:
        """Whether the token's unverified ``exp`` is within ``RENEW_BEFORE_EXP_SECONDS``; False without one."""
        try:
            payload = token.split(".")[1]
            exp = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))).get("exp")
        except (IndexError, ValueError, AttributeError):
            return False
        return isinstance(exp, int | float) and exp - RENEW_BEFORE_EXP_SECONDS <= self._clock()
