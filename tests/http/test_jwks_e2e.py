"""Tokens from an identity provider on the real processes (docs/keys.md: Connect your identity provider): the
system verifies tokens with the provider's JWKS, the provider rotates its key while the command-line client
waits for an export, and the client's token command gives it a token of the new key when the old one is
refused, so the export completes without a restart of anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization

from devtools.broker import delete_broker_objects
from devtools.identity_provider import IdentityProvider, SigningKey, identity_provider, new_key
from devtools.localsystem import LocalSystem
from shared.storage import ensure_bucket, open_s3_client
from tests.support import AMQP_URL, cloned_database, unique, wait_for
from tests.support.api_calls import import_lines, make_conversation

pytestmark = pytest.mark.e2e

OLD = new_key("idp-old")
NEW = new_key("idp-new")


@pytest.fixture
async def provider() -> AsyncIterator[IdentityProvider]:
    async with identity_provider(OLD) as running:
        running.cache_control = "max-age=0"  # as some providers send: the system's minimum applies
        yield running


@pytest.fixture
async def jwks_system(
    template_db: str, provider: IdentityProvider, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LocalSystem]:
    """The compose file's parts verifying tokens with ``provider``'s JWKS, without workers at first. Started
    in a thread: the api is not ready before it has fetched the keys from the provider this loop serves.
    """
    overrides = {
        "CHATEXPORT_ENVIRONMENT": "development",
        "CHATEXPORT_JANITOR_INTERVAL_SECONDS": "1",
        "CHATEXPORT_JWT_JWKS_URL": provider.jwks_url,
        "CHATEXPORT_JWT_ISSUER": provider.issuer,
        "CHATEXPORT_JWT_AUDIENCE": "chatexport",
        "CHATEXPORT_JWKS_MIN_CACHE_SECONDS": "1",
    }
    async with cloned_database(template_db, "chatexport_jwks") as database_url:
        local = LocalSystem(
            database_url=database_url,
            amqp_url=AMQP_URL,
            log_dir=tmp_path_factory.mktemp("e2e-jwks-logs"),
            overrides=overrides,
        )
        try:
            local.start_storage()
            async with open_s3_client(local.settings()) as s3:
                await ensure_bucket(s3, local.settings().s3_bucket)  # the workers' job, and none runs yet
            await asyncio.to_thread(local.start_parts, workers=0)
            yield local
        finally:
            codes = await asyncio.to_thread(local.stop)
            await delete_broker_objects(local.settings())
            assert all(code in (0, -15) for name, code in codes.items() if name != "moto"), codes


def token_command(tmp_path: Path, provider: IdentityProvider, keys: list[SigningKey]) -> tuple[str, Path, Path]:
    """A token command signing alice's tokens with the key named in a file (``current``), and the files it
    reads (``current``) and counts its runs in (``runs``)."""
    for key in keys:
        pem = key.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        (tmp_path / f"{key.kid}.pem").write_bytes(pem)
    current, runs = tmp_path / "current", tmp_path / "runs"
    current.write_text(keys[0].kid)
    runs.write_text("0")
    script = tmp_path / "token_command.py"
    script.write_text(
        "import json, pathlib, time, jwt\n"
        f"folder = pathlib.Path({str(tmp_path)!r})\n"
        "runs = folder / 'runs'\n"
        "runs.write_text(str(int(runs.read_text()) + 1))\n"
        "kid = (folder / 'current').read_text()\n"
        "now = int(time.time())\n"
        f"claims = {{'sub': 'alice', 'iss': {provider.issuer!r}, 'aud': 'chatexport', 'iat': now, 'exp': now + 600}}\n"
        "print(jwt.encode(claims, (folder / f'{kid}.pem').read_bytes(), algorithm='RS256', headers={'kid': kid}))\n"
    )
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}", current, runs


async def test_an_export_survives_a_key_rotation_with_the_token_command(
    jwks_system: LocalSystem, provider: IdentityProvider, tmp_path: Path
) -> None:
    cid = unique("jwks-conversation")

    def admin(user: str, *, admin: bool = False) -> dict[str, str]:
        return {"Authorization": f"Bearer {provider.token(OLD, sub=user, scope='admin')}"}

    async with aiohttp.ClientSession(base_url=jwks_system.base_url) as api:
        await make_conversation(api, admin, cid, ["alice"])
        lines = [{"message_id": f"m{n}", "sender_id": "alice", "body": f"message {n}"} for n in range(200)]
        await import_lines(api, admin, cid, lines)

        command, current, runs = token_command(tmp_path, provider, [OLD, NEW])
        output = tmp_path / "export.jsonl"
        env = {name: value for name, value in os.environ.items() if not name.startswith("CHATEXPORT_")}
        env.update({"CHATEXPORT_API_URL": jwks_system.base_url, "CHATEXPORT_TOKEN_COMMAND": command})
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "chatexport.cli", "export", cid, "-o", str(output),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:

            async def submitted() -> bool:
                headers = {"Authorization": f"Bearer {provider.token(OLD)}"}
                page = await (await api.get("/v3/operations", headers=headers)).json()
                return bool(page.get("operations"))

            await wait_for(submitted, timeout=60)  # queued: no worker runs yet, the client waits

            # The rotation: the provider signs with the new key and no longer publishes the old one.
            current.write_text(NEW.kid)
            provider.published = [NEW]
            fetched = provider.fetches()
            await wait_for(lambda: provider.fetches() >= fetched + 2, timeout=30)
            refused = await api.get("/v3/operations", headers={"Authorization": f"Bearer {provider.token(OLD)}"})
            assert refused.status == 401

            await asyncio.to_thread(jwks_system.start_part, "worker")
            _, err = await asyncio.wait_for(client.communicate(), timeout=120)
        finally:
            if client.returncode is None:
                client.kill()
                await client.wait()
    assert client.returncode == 0, err.decode()
    assert int(runs.read_text()) == 2  # the first token, then one of the new key after the 401
    exported = [json.loads(line) for line in output.read_text().splitlines()]
    assert [line["message_id"] for line in exported] == [f"m{n}" for n in range(200)]
