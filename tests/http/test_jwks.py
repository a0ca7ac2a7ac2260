"""Tokens from an identity provider's JWKS (docs/keys.md: Connect your identity provider): rotation without a
401, one fetch for a new key, none for forged kids, cached keys through an outage, and every refusal.
The provider is the tests' own, on 127.0.0.1, counting its requests.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import string
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pydantic
import pytest
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives import serialization

from devtools.broker import delete_broker_objects
from devtools.identity_provider import IdentityProvider, identity_provider, new_key
from services.api.app import init_app
from shared.auth import InvalidToken, TokenVerifier
from shared.jwks import KEY_TYPES, KeysUnavailable, RemoteKeys, max_age_of
from shared.settings import PUBLIC_KEY_ALGORITHMS, Settings
from shared.storage import ensure_bucket, open_s3_client
from tests.support import make_settings, wait_for

OLD = new_key("key-2026-11")
NEW = new_key("key-2026-12")
EC_KEY = new_key("key-ec", "ES256")


def settings_for(provider: IdentityProvider, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "jwt_jwks_url": provider.jwks_url,
        "jwt_issuer": provider.issuer,
        "jwt_audience": "chatexport",
    }
    return Settings(**{**values, **overrides})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def provider() -> AsyncIterator[IdentityProvider]:
    async with identity_provider(OLD) as running:
        yield running


async def loaded(provider: IdentityProvider, **overrides: Any) -> tuple[TokenVerifier, RemoteKeys]:
    keys = RemoteKeys(settings_for(provider, **overrides))
    assert await keys.refresh()
    return TokenVerifier(settings_for(provider, **overrides), keys=keys), keys


def bearer(token: str) -> str:
    return f"Bearer {token}"


async def test_a_rotation_passes_with_no_401_and_no_restart(provider: IdentityProvider) -> None:
    provider.cache_control = "max-age=0"  # refreshed as often as the minimum allows
    keys = RemoteKeys(settings_for(provider, jwks_min_cache_seconds=0.2))
    verifier = TokenVerifier(settings_for(provider), keys=keys)
    refreshing = asyncio.create_task(keys.run())
    try:
        await wait_for(lambda: provider.fetches() >= 1)
        old_token = bearer(provider.token(OLD))
        assert (await verifier.verify(old_token)).user_id == "alice"

        provider.published = [OLD, NEW]  # the new key published beside the old one
        new_token = bearer(provider.token(NEW))
        for _ in range(20):
            assert (await verifier.verify(old_token)).user_id == "alice"
            assert (await verifier.verify(new_token)).user_id == "alice"
            await asyncio.sleep(0.02)  # pacing the loop across refreshes, not synchronisation

        provider.published = [NEW]  # then the old one removed: its tokens stop verifying at the next refresh

        async def old_refused() -> bool:
            try:
                await verifier.verify(old_token)
            except InvalidToken as refusal:
                return refusal.kind == "key"
            return False

        await wait_for(old_refused)
        assert (await verifier.verify(new_token)).user_id == "alice"
    finally:
        refreshing.cancel()


async def test_a_token_of_a_key_the_cache_does_not_know_yet_is_accepted_after_one_fetch(
    provider: IdentityProvider,
) -> None:
    verifier, _ = await loaded(provider)
    assert provider.fetches() == 1
    provider.published = [OLD, NEW]

    assert (await verifier.verify(bearer(provider.token(NEW)))).user_id == "alice"
    assert provider.fetches() == 2
    assert (await verifier.verify(bearer(provider.token(NEW, sub="bob")))).user_id == "bob"
    assert provider.fetches() == 2


async def test_a_thousand_random_kids_cost_at_most_one_fetch_per_cooldown(provider: IdentityProvider) -> None:
    verifier, _ = await loaded(provider)
    forger = new_key("forged")

    async def forged() -> None:
        kid = "".join(random.choices(string.ascii_letters, k=12))
        with pytest.raises(InvalidToken) as refused:
            await verifier.verify(bearer(provider.token(forger, headers={"kid": kid})))
        assert refused.value.kind == "key"

    await asyncio.gather(*(forged() for _ in range(1000)))
    assert provider.fetches() <= 2  # the first load, and one for the first unknown kid
    assert (await verifier.verify(bearer(provider.token(OLD)))).user_id == "alice"


async def test_the_provider_down_for_an_hour_leaves_the_cached_keys_working(provider: IdentityProvider) -> None:
    clock = Clock()
    settings = settings_for(provider)
    keys = RemoteKeys(settings, clock=clock)
    assert await keys.refresh()
    verifier = TokenVerifier(settings, keys=keys)
    provider.down = True

    clock.now += 3600
    assert not await keys.refresh()
    await keys.check()  # still ready
    assert (await verifier.verify(bearer(provider.token(OLD, sub="carol")))).user_id == "carol"

    clock.now += settings.jwks_max_stale_seconds  # past the maximum staleness, the old keys no longer count
    with pytest.raises(KeysUnavailable):
        await keys.check()
    with pytest.raises(InvalidToken):
        await verifier.verify(bearer(provider.token(OLD)))

    provider.down = False
    assert await keys.refresh()
    await keys.check()


async def test_the_set_is_kept_for_its_max_age_within_the_bounds(provider: IdentityProvider) -> None:
    assert [max_age_of(value) for value in ("max-age=120", "public, max-age=0", "no-store", None, "private")] == [
        120.0,
        0.0,
        0.0,
        None,
        None,
    ]
    clock = Clock()
    for cache_control, kept in (("max-age=0", 60), ("max-age=600", 600), ("max-age=999999", 86400), (None, 600)):
        provider.cache_control = cache_control
        keys = RemoteKeys(settings_for(provider), clock=clock)
        assert await keys.refresh()
        assert keys.next_refresh_at - clock.now == pytest.approx(kept * 0.8)


async def test_discovery_reads_the_jwks_url_from_the_issuer(provider: IdentityProvider) -> None:
    settings = Settings(jwt_oidc_discovery=True, jwt_issuer=provider.issuer, jwt_audience="chatexport")
    keys = RemoteKeys(settings)
    assert await keys.refresh()
    assert provider.requests == ["/.well-known/openid-configuration", "/keys"]
    assert (await TokenVerifier(settings, keys=keys).verify(bearer(provider.token(OLD)))).user_id == "alice"

    other = RemoteKeys(Settings(jwt_oidc_discovery=True, jwt_issuer=provider.issuer + "/other"))
    assert not await other.refresh()  # the document names another issuer


def public_pem(key: Any) -> bytes:
    public = key.private.public_key()
    pem: bytes = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem


def unsigned(claims: dict[str, Any], header: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part(header)}.{part(claims)}."


async def test_each_forgery_and_each_bad_claim_is_refused(provider: IdentityProvider) -> None:
    provider.published = [OLD, EC_KEY]
    verifier, _ = await loaded(provider)
    now = int(time.time())
    claims = {"sub": "alice", "iss": provider.issuer, "aud": "chatexport", "exp": now + 60}

    async with identity_provider(new_key("attacker")) as attacker:
        attacker_key = attacker.published[0]
        jku = provider.token(attacker_key, headers={"kid": "attacker", "jku": attacker.url + "/keys"})
        refused = {
            # The RSA public key used as an HS256 secret (algorithm confusion).
            "confused": jwt.encode(claims, OLD.public_jwk()["n"], algorithm="HS256", headers={"kid": OLD.kid}),
            "alg none": unsigned(claims, {"alg": "none", "kid": OLD.kid}),
            "jku": jku,
            "embedded jwk": provider.token(attacker_key, headers={"kid": OLD.kid, "jwk": attacker_key.public_jwk()}),
            "wrong iss": provider.token(OLD, iss="https://elsewhere.example"),
            "no aud": provider.token(OLD, aud=None),
            "expired": provider.token(OLD, iat=now - 600, exp=now - 300),
            "key of the wrong type": jwt.encode(
                claims, EC_KEY.private, algorithm="ES256", headers={"kid": OLD.kid}
            ),  # an EC signature naming the RSA key
        }
        kinds = {}
        for name, token in refused.items():
            with pytest.raises(InvalidToken) as refusal:
                await verifier.verify(bearer(token))
            kinds[name] = refusal.value.kind
        assert attacker.requests == []
    assert kinds == {
        "confused": "algorithm",
        "alg none": "algorithm",
        "jku": "key",
        "embedded jwk": "signature",
        "wrong iss": "claims",
        "no aud": "claims",
        "expired": "expired",
        "key of the wrong type": "key",
    }


async def test_a_kidless_token_needs_a_set_of_exactly_one_key(provider: IdentityProvider) -> None:
    verifier, _ = await loaded(provider)
    assert (await verifier.verify(bearer(provider.token(OLD, headers={"kid": None})))).user_id == "alice"
    provider.published = [OLD, NEW]
    verifier, _ = await loaded(provider)
    with pytest.raises(InvalidToken):
        await verifier.verify(bearer(provider.token(OLD, headers={"kid": None})))


async def test_static_key_files_overlap_during_a_rotation(tmp_path: Path, provider: IdentityProvider) -> None:
    (tmp_path / "old.pem").write_bytes(public_pem(OLD))
    (tmp_path / "new.json").write_text(json.dumps({"keys": [NEW.public_jwk()]}))
    settings = Settings(
        jwt_key_files=f"{tmp_path / 'old.pem'},{tmp_path / 'new.json'}",
        jwt_issuer=provider.issuer,
        jwt_audience="chatexport",
    )
    verifier = TokenVerifier(settings)
    assert (await verifier.verify(bearer(provider.token(OLD, headers={"kid": None})))).user_id == "alice"
    assert (await verifier.verify(bearer(provider.token(NEW)))).user_id == "alice"
    assert provider.requests == []


async def test_the_user_and_admin_claims_and_the_authorized_parties_are_settings(provider: IdentityProvider) -> None:
    verifier, _ = await loaded(
        provider,
        jwt_user_claim="preferred_username",
        jwt_admin_claim="realm_access.roles",
        jwt_admin_value="chatexport-admin",
        jwt_authorized_parties="chatexport-cli,chatexport-web",
    )
    admin = provider.token(
        OLD, preferred_username="ops", realm_access={"roles": ["chatexport-admin"]}, azp="chatexport-cli"
    )
    principal = await verifier.verify(bearer(admin))
    assert (principal.user_id, principal.is_admin) == ("ops", True)
    member = await verifier.verify(bearer(provider.token(OLD, preferred_username="bob", azp="chatexport-web")))
    assert (member.user_id, member.is_admin) == ("bob", False)
    for token in (
        provider.token(OLD, preferred_username="bob", azp="other"),
        provider.token(OLD, azp="chatexport-cli"),
    ):
        with pytest.raises(InvalidToken):
            await verifier.verify(bearer(token))


@pytest.mark.parametrize(
    "overrides",
    [
        {"jwt_jwks_url": "http://idp.example/keys"},  # http to a host that is not loopback
        {"jwt_jwks_url": "https://idp.example/keys", "jwt_public_key": "x"},  # two sources
        {"jwt_oidc_discovery": True},  # discovery without an issuer
        {"jwt_jwks_url": "https://idp.example/keys", "jwt_algorithms": "HS256"},
        {"jwt_jwks_url": "https://idp.example/keys", "jwt_algorithms": "none"},
    ],
)
def test_the_settings_refuse_a_key_source_that_cannot_be_safe(overrides: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        Settings(**overrides)


def test_production_fetches_keys_over_https_only() -> None:
    with pytest.raises(pydantic.ValidationError):
        Settings(environment="production", jwt_jwks_url="http://127.0.0.1:9/keys", webhook_signing_key="k" * 40)
    settings = Settings(environment="production", jwt_jwks_url="https://idp.example/keys", webhook_signing_key="k" * 40)
    assert settings.uses_public_keys


async def test_the_api_is_not_ready_until_its_keys_are_in_and_a_401_names_the_token_only(
    database_url: str, moto: Any, provider: IdentityProvider
) -> None:
    provider.down = True
    settings = make_settings(
        database_url, moto.endpoint_url, jwt_jwks_url=provider.jwks_url, jwt_issuer=provider.issuer
    )
    async with open_s3_client(settings) as s3:
        await ensure_bucket(s3, settings.s3_bucket)
    client: TestClient[Any, Any] = TestClient(TestServer(init_app(settings)))
    await client.start_server()
    try:
        waiting = await client.get("/readyz")
        assert waiting.status == 503
        assert (await waiting.json())["checks"]["keys"] == "KeysUnavailable"
        provider.down = False

        async def ready() -> bool:
            return (await client.get("/readyz")).status == 200

        await wait_for(ready, timeout=20)
        good = await client.get("/v3/operations", headers={"Authorization": bearer(provider.token(OLD, aud=None))})
        assert good.status == 200
        forged = provider.token(new_key("attacker"), headers={"kid": OLD.kid})
        refused = await client.get("/v3/operations", headers={"Authorization": bearer(forged)})
        assert refused.status == 401
        assert refused.headers["WWW-Authenticate"].startswith('Bearer error="invalid_token"')
        body = await refused.text()
        assert forged not in body and OLD.public_jwk()["n"] not in body
    finally:
        await client.close()
        await delete_broker_objects(settings)


async def test_a_set_that_arrives_in_pieces_is_read_whole(provider: IdentityProvider) -> None:
    provider.in_pieces = True
    verifier, _ = await loaded(provider)
    assert (await verifier.verify(bearer(provider.token(OLD)))).user_id == "alice"


@pytest.mark.parametrize(
    "document",
    [
        b"[" * 200_000,  # nested too deeply for the JSON parser
        json.dumps({"keys": [{**NEW.public_jwk(), "alg": ["RS256"]}]}).encode(),
        json.dumps({"keys": [{**NEW.public_jwk(), "alg": "none"}]}).encode(),
        json.dumps({"keys": [{**NEW.public_jwk(), "d": "AQAB"}]}).encode(),  # a private key has no place here
    ],
    # Named, not shown: the keys are made anew in each process, and xdist needs one collection in all.
    ids=["nested-too-deeply", "alg-not-a-string", "alg-none", "private-key"],
)
async def test_a_bad_set_keeps_the_old_keys_and_the_refresh_goes_on(
    provider: IdentityProvider, document: bytes
) -> None:
    provider.cache_control = "max-age=0"
    keys = RemoteKeys(settings_for(provider, jwks_min_cache_seconds=0.2, jwks_unknown_kid_cooldown_seconds=0.2))
    verifier = TokenVerifier(settings_for(provider), keys=keys)
    refreshing = asyncio.create_task(keys.run())
    try:
        await wait_for(lambda: provider.fetches() >= 1)
        provider.raw = document
        fetched = provider.fetches()
        await wait_for(lambda: provider.fetches() >= fetched + 2)  # refused, and tried again
        assert (await verifier.verify(bearer(provider.token(OLD)))).user_id == "alice"

        provider.raw, provider.published = None, [NEW]

        async def rotated() -> bool:
            try:
                await verifier.verify(bearer(provider.token(OLD)))
            except InvalidToken:
                return True
            return False

        await wait_for(rotated)
        assert not refreshing.done()
        assert (await verifier.verify(bearer(provider.token(NEW)))).user_id == "alice"
    finally:
        refreshing.cancel()


async def test_the_set_is_refreshed_before_it_would_be_too_stale(provider: IdentityProvider) -> None:
    clock = Clock()
    keys = RemoteKeys(settings_for(provider, jwks_max_stale_seconds=3600), clock=clock)
    provider.cache_control = "max-age=86400"
    assert await keys.refresh()
    assert keys.next_refresh_at - clock.now == pytest.approx(3600 * 0.8)


async def test_a_key_republished_for_another_use_verifies_nothing_remembered(provider: IdentityProvider) -> None:
    verifier, keys = await loaded(provider)
    token = bearer(provider.token(OLD))
    assert (await verifier.verify(token)).user_id == "alice"
    provider.raw = json.dumps({"keys": [{**OLD.public_jwk(), "use": "enc"}]}).encode()
    assert await keys.refresh()
    with pytest.raises(InvalidToken):
        await verifier.verify(token)


async def test_an_azp_that_is_no_string_is_refused(provider: IdentityProvider) -> None:
    verifier, _ = await loaded(provider, jwt_authorized_parties="chatexport-cli")
    with pytest.raises(InvalidToken) as refusal:
        await verifier.verify(bearer(provider.token(OLD, azp=["chatexport-cli"])))
    assert refusal.value.kind == "claims"


def test_every_allowed_public_key_algorithm_has_its_key_type() -> None:
    # The settings' list of algorithms and the key cache's table of key types must name the same ones.
    assert {alg for alg, (kty, _) in KEY_TYPES.items() if kty != "oct"} == PUBLIC_KEY_ALGORITHMS
