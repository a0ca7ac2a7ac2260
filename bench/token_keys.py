"""Benchmark: polls with tokens an identity provider signed (RS256, verified with its JWKS) against polls with
tokens of the HS256 secret, in one run, under ``wrk -t1 -c32`` (docs/benchmark.md: Tokens from an identity
provider); then the JWKS fetches that 1,000 tokens with random ``kid``s cost.

Starts a system verifying tokens with a local identity provider's JWKS (``devtools.identity_provider``) and
one with the HS256 secret, prepares ``bench.http_load.USERS`` users with one finished export each on both,
and polls their operations on each in turn, ``ROUNDS`` rounds, the best of each kept; while wrk runs, every
part of that system but its api is stopped. Usage:

    .venv/bin/python bench/token_keys.py [--seconds N]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import string
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.http_load import SETTINGS, lua_requests, paused_background, poll_requests, prepare, wrk
from bench.running import running_system
from bench.table import Figure, print_table
from devtools.identity_provider import IdentityProvider, identity_provider_thread, new_key
from devtools.localsystem import LocalSystem

FORGED_TOKENS = 1000


ROUNDS = 3


def polls(system: LocalSystem, prepared: list[tuple[str, str, str]], seconds: int) -> float:
    """Polls per second of ``system``'s api with the prepared tokens, every other part paused."""
    with paused_background(system):
        load = wrk(system.base_url, lua_requests("GET", poll_requests(prepared)), seconds)
    assert load.non_2xx == 0, load
    return load.requests_per_second


async def forged_fetches(system: LocalSystem, provider: IdentityProvider) -> int:
    """The JWKS fetches that ``FORGED_TOKENS`` tokens with random ``kid``s cost ``system``."""
    forger, before = new_key("forger"), provider.fetches()
    async with aiohttp.ClientSession(base_url=system.base_url) as api:

        async def forged() -> None:
            kid = "".join(random.choices(string.ascii_letters, k=16))
            headers = {"Authorization": f"Bearer {provider.token(forger, headers={'kid': kid})}"}
            async with api.get("/v3/operations", headers=headers) as response:
                assert response.status == 401

        await asyncio.gather(*(forged() for _ in range(FORGED_TOKENS)))
    return provider.fetches() - before


async def figures(seconds: int) -> list[Figure]:
    """Both systems side by side, their polls measured in turns, ``ROUNDS`` rounds, the best of each kept (see
    the module's docstring).
    """
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")
    with identity_provider_thread(new_key("bench-key")) as provider:
        [key] = provider.published
        overrides = {
            **SETTINGS,
            "CHATEXPORT_ENVIRONMENT": "development",
            "CHATEXPORT_JWT_JWKS_URL": provider.jwks_url,
            "CHATEXPORT_JWT_ISSUER": provider.issuer,
            "CHATEXPORT_JWT_AUDIENCE": "chatexport",
        }
        async with (
            running_system(workers=2, overrides=overrides) as jwks_system,
            running_system(workers=2, overrides=SETTINGS) as secret_system,
        ):
            an_hour = int(time.time()) + 3600
            admin = {"Authorization": f"Bearer {provider.token(key, sub='root', scope='admin', exp=an_hour)}"}
            jwks_prepared = await prepare(
                jwks_system, token_for=lambda user: provider.token(key, sub=user, exp=an_hour), admin=admin
            )
            secret_prepared = await prepare(secret_system)
            jwks, secret = 0.0, 0.0
            for _ in range(ROUNDS):
                jwks = max(jwks, await asyncio.to_thread(polls, jwks_system, jwks_prepared, seconds))
                secret = max(secret, await asyncio.to_thread(polls, secret_system, secret_prepared, seconds))
            fetches = await forged_fetches(jwks_system, provider)
    print(f"JWKS (RS256) polls {jwks:,.0f} req/s, HS256 secret polls {secret:,.0f} req/s (best of {ROUNDS})")
    print(f"{FORGED_TOKENS} tokens with random kids: {fetches} JWKS fetch(es)")
    return [
        Figure("GET /v3/operations/{id} with RS256 tokens of a JWKS, wrk -t1 -c32", jwks, "req/s", secret,
               "HS256 secret", "equal within noise"),
        Figure(f"JWKS fetches for {FORGED_TOKENS:,} tokens with random kids", fetches, "fetches", None, "",
               "<= 1 per 30 s cool-down"),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    print_table(asyncio.run(figures(parser.parse_args().seconds)))


if __name__ == "__main__":
    main()
