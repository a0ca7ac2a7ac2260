"""A local identity provider for the tests and the benchmarks: it publishes a JWKS (and an OpenID discovery
document) on 127.0.0.1, counts the requests it gets, can be taken down, and signs tokens with its keys.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

JWKS_PATH = "/keys"
DISCOVERY_PATH = "/.well-known/openid-configuration"


@dataclass
class SigningKey:
    """A private key of the provider, its ``kid`` and ``alg``."""

    kid: str
    alg: str
    private: Any

    def public_jwk(self) -> dict[str, Any]:
        """The public half as a JWK, naming its ``kid``, ``alg`` and ``use``."""
        algorithm = jwt.get_algorithm_by_name(self.alg)
        jwk: dict[str, Any] = json.loads(algorithm.to_jwk(self.private.public_key()))
        return {**jwk, "kid": self.kid, "alg": self.alg, "use": "sig"}


def new_key(kid: str, alg: str = "RS256") -> SigningKey:
    """A fresh key for ``alg`` (RS256, ES256 or EdDSA)."""
    private: Any
    if alg == "ES256":
        private = ec.generate_private_key(ec.SECP256R1())
    elif alg == "EdDSA":
        private = ed25519.Ed25519PrivateKey.generate()
    else:
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return SigningKey(kid, alg, private)


@dataclass
class IdentityProvider:
    """What the provider publishes and what it was asked: ``published`` keys, the ``cache_control`` of its
    JWKS, ``down`` (then it answers 503), and ``requests``, the paths asked, in order. ``url`` is its base.
    """

    published: list[SigningKey] = field(default_factory=list)
    cache_control: str | None = "max-age=300"
    down: bool = False
    # Instead of the set: these bytes as the JWKS's body (a document that is no usable set).
    raw: bytes | None = None
    # Send the set in two pieces a moment apart, as a long answer over a real network arrives.
    in_pieces: bool = False
    requests: list[str] = field(default_factory=list)
    url: str = ""
    issuer: str = ""

    @property
    def jwks_url(self) -> str:
        """Where the JWKS is."""
        return self.url + JWKS_PATH

    def fetches(self) -> int:
        """How many times the JWKS was asked for."""
        return self.requests.count(JWKS_PATH)

    def token(self, key: SigningKey, *, headers: dict[str, Any] | None = None, **claims: Any) -> str:
        """A token signed by ``key`` (its ``kid`` in the header unless ``headers`` says otherwise) for ``alice``,
        issued by this provider, valid for a minute; ``claims`` change or (as None) remove claims.
        """
        now = int(time.time())
        values: dict[str, Any] = {"sub": "alice", "iss": self.issuer, "aud": "chatexport", "iat": now, "exp": now + 60}
        values.update(claims)
        body = {name: value for name, value in values.items() if value is not None}
        header = {name: value for name, value in {"kid": key.kid, **(headers or {})}.items() if value is not None}
        return jwt.encode(body, key.private, algorithm=key.alg, headers=header)

    def _app(self) -> web.Application:
        async def jwks(request: web.Request) -> web.StreamResponse:
            self.requests.append(request.path)
            if self.down:
                return web.Response(status=503)
            headers = {"Cache-Control": self.cache_control} if self.cache_control else {}
            body = self.raw or json.dumps({"keys": [key.public_jwk() for key in self.published]}).encode()
            if not self.in_pieces:
                return web.Response(body=body, headers=headers, content_type="application/json")
            response = web.StreamResponse(headers={**headers, "Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(body[: len(body) // 2])
            await asyncio.sleep(0.05)  # the second piece comes later, in its own packet
            await response.write(body[len(body) // 2 :])
            await response.write_eof()
            return response

        async def discovery(request: web.Request) -> web.Response:
            self.requests.append(request.path)
            return web.json_response({"issuer": self.issuer, "jwks_uri": self.jwks_url})

        async def other(request: web.Request) -> web.Response:
            self.requests.append(request.path)
            return web.json_response({"keys": [key.public_jwk() for key in self.published]})

        app = web.Application()
        app.router.add_get(JWKS_PATH, jwks)
        app.router.add_get(DISCOVERY_PATH, discovery)
        app.router.add_get("/{anything:.*}", other)
        return app


@contextlib.asynccontextmanager
async def identity_provider(*keys: SigningKey) -> AsyncIterator[IdentityProvider]:
    """An identity provider publishing ``keys`` on a port of 127.0.0.1 chosen by the system, while inside."""
    provider = IdentityProvider(published=list(keys))
    runner = web.AppRunner(provider._app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    provider.url = provider.issuer = f"http://127.0.0.1:{port}"
    try:
        yield provider
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def identity_provider_thread(*keys: SigningKey) -> Iterator[IdentityProvider]:
    """``identity_provider`` on an event loop of its own in a thread, for callers whose own loop blocks (a
    benchmark starting a system, which waits for the api to be ready, and so for its keys).
    """
    started: concurrent.futures.Future[tuple[IdentityProvider, asyncio.AbstractEventLoop, asyncio.Event]]
    started = concurrent.futures.Future()

    async def serve() -> None:
        stop = asyncio.Event()
        async with identity_provider(*keys) as provider:
            started.set_result((provider, asyncio.get_running_loop(), stop))
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), name="identity-provider", daemon=True)
    thread.start()
    provider, loop, stop = started.result(timeout=30)
    try:
        yield provider
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
