"""Bearer token verification (docs/api.md: Tokens and keys, Authentication)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from shared.auth import InvalidToken, TokenVerifier, mint_token
from shared.settings import Settings
from tests.support import wait_for

SECRET = "unit-test-secret-of-at-least-32-bytes"
SETTINGS = Settings(jwt_secret=SECRET)


def token(claims: dict[str, Any], *, key: Any = SECRET, algorithm: str = "HS256") -> str:
    return jwt.encode(claims, key, algorithm=algorithm)


def valid_claims(**changes: Any) -> dict[str, Any]:
    claims: dict[str, Any] = {"sub": "alice", "exp": int(time.time()) + 60}
    claims.update(changes)
    return {key: value for key, value in claims.items() if value is not None}


async def test_a_minted_token_verifies_with_its_scopes() -> None:
    verifier = TokenVerifier(SETTINGS)
    principal = await verifier.verify(f"Bearer {mint_token(SETTINGS, user_id='u.1:x-y_z', scopes=['admin', 'read'])}")
    assert principal.user_id == "u.1:x-y_z"
    assert principal.is_admin
    assert principal.scopes == {"admin", "read"}
    assert not (await verifier.verify(f"bearer {mint_token(SETTINGS, user_id='bob')}")).is_admin


@pytest.mark.parametrize(
    ("scope", "scopes"),
    [
        ("admin read", {"admin", "read"}),
        ("  admin  read ", {"admin", "read"}),
        ("admin\tuser", {"admin\tuser"}),
        ("admin\u00a0user", {"admin\u00a0user"}),
        ("user\nadmin", {"user\nadmin"}),
        ("user\u2003admin\u3000x", {"user\u2003admin\u3000x"}),
    ],
)
async def test_scopes_are_split_on_the_space_alone(scope: str, scopes: set[str]) -> None:
    principal = await TokenVerifier(SETTINGS).verify(f"Bearer {token(valid_claims(scope=scope))}")
    assert principal.scopes == scopes
    assert principal.is_admin == ("admin" in scopes)


# Named, so that every pytest-xdist worker collects the same ids: a token's claims hold the time it was made.
INVALID_HEADERS = {
    "absent": None,
    "empty": "",
    "bearer-alone": "Bearer",
    "bearer-space": "Bearer ",
    "basic": "Basic YWxpY2U6c2VjcmV0",
    "not-a-jwt": "Bearer not.a.jwt",
    "expired": f"Bearer {token(valid_claims(exp=int(time.time()) - 120))}",
    "other-key": f"Bearer {token(valid_claims(), key='another-secret-also-at-least-32-bytes')}",
    "no-exp": f"Bearer {token(valid_claims(exp=None))}",
    "no-sub": f"Bearer {token(valid_claims(sub=None))}",
    "exp-a-string": f"Bearer {token(valid_claims(exp='99999999999'))}",
    "sub-with-space": f"Bearer {token(valid_claims(sub='has space'))}",
    "sub-too-long": f"Bearer {token(valid_claims(sub='x' * 65))}",
    "sub-a-number": f"Bearer {token(valid_claims(sub=42))}",
    "scope-a-list": f"Bearer {token(valid_claims(scope=['admin']))}",
    "hs512": f"Bearer {token(valid_claims(), key=SECRET * 2, algorithm='HS512')}",
    "alg-none": f"Bearer {jwt.encode(valid_claims(), '', algorithm='none')}",
}


@pytest.mark.parametrize("header", list(INVALID_HEADERS.values()), ids=list(INVALID_HEADERS))
async def test_invalid_tokens_are_refused(header: str | None) -> None:
    with pytest.raises(InvalidToken):
        await TokenVerifier(SETTINGS).verify(header)


async def test_issuer_and_audience_are_checked_when_configured() -> None:
    settings = Settings(
        jwt_secret="unit-test-secret-of-at-least-32-bytes", jwt_issuer="https://issuer", jwt_audience="chatexport"
    )
    verifier = TokenVerifier(settings)
    assert (await verifier.verify(f"Bearer {mint_token(settings, user_id='alice')}")).user_id == "alice"
    for claims in (valid_claims(iss="https://other", aud="chatexport"), valid_claims(iss="https://issuer")):
        with pytest.raises(InvalidToken):
            await verifier.verify(f"Bearer {token(claims)}")


async def test_es256_with_a_configured_public_key() -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    verifier = TokenVerifier(Settings(jwt_public_key=public_pem.decode()))
    assert (await verifier.verify(f"Bearer {token(valid_claims(), key=private, algorithm='ES256')}")).user_id == "alice"
    with pytest.raises(InvalidToken):
        await verifier.verify(f"Bearer {token(valid_claims())}")  # HS256 is not accepted once a key is configured


def _encode_raw(header: str, payload: str) -> str:
    """A compact HS256 JWS over the literal JSON texts ``header`` and ``payload`` (repeated names kept)."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = f"{b64(header.encode())}.{b64(payload.encode())}"
    signature = hmac.new(SECRET.encode(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


@pytest.mark.parametrize("skew", [1, 3, 29])
async def test_iat_and_nbf_a_little_ahead_of_our_clock_are_within_the_leeway(skew: int) -> None:
    ahead = int(time.time()) + skew
    verifier = TokenVerifier(SETTINGS)
    assert SETTINGS.jwt_leeway_seconds == 30
    assert (await verifier.verify(f"Bearer {token(valid_claims(iat=ahead, nbf=ahead))}")).user_id == "alice"


@pytest.mark.parametrize("claim", ["iat", "nbf"])
@pytest.mark.parametrize("skew", [35, 3600])
async def test_iat_or_nbf_beyond_the_leeway_is_refused(claim: str, skew: int) -> None:
    with pytest.raises(InvalidToken) as refused:
        await TokenVerifier(SETTINGS).verify(f"Bearer {token(valid_claims(**{claim: int(time.time()) + skew}))}")
    assert not refused.value.expired


async def test_exp_just_past_is_within_the_leeway_and_beyond_it_is_expired() -> None:
    now = int(time.time())
    verifier = TokenVerifier(SETTINGS)
    assert (await verifier.verify(f"Bearer {token(valid_claims(exp=now - 10))}")).user_id == "alice"
    with pytest.raises(InvalidToken) as refused:
        await verifier.verify(f"Bearer {token(valid_claims(exp=now - 40))}")
    assert refused.value.expired


async def test_without_leeway_a_token_expired_ten_seconds_ago_is_refused() -> None:
    strict = Settings(jwt_secret=SECRET, jwt_leeway_seconds=0)
    with pytest.raises(InvalidToken):
        await TokenVerifier(strict).verify(f"Bearer {token(valid_claims(exp=int(time.time()) - 10))}")


async def test_only_a_genuine_token_is_called_expired() -> None:
    old = valid_claims(exp=int(time.time()) - 3600)
    with pytest.raises(InvalidToken) as forged:
        await TokenVerifier(SETTINGS).verify(f"Bearer {token(old, key='another-secret-also-at-least-32-bytes')}")
    assert not forged.value.expired
    with pytest.raises(InvalidToken) as genuine:
        await TokenVerifier(SETTINGS).verify(f"Bearer {token(old)}")
    assert genuine.value.expired


@pytest.mark.parametrize("exp", [False, True, "1000", 1000.0, [1000]])
async def test_an_exp_that_is_not_a_numeric_date_is_invalid_not_expired(exp: Any) -> None:
    """PyJWT reads false, true and "1000" as long-past times; RFC 7519 section 2 makes exp a JSON number."""
    with pytest.raises(InvalidToken) as refused:
        await TokenVerifier(SETTINGS).verify(f"Bearer {token(valid_claims(exp=exp))}")
    assert refused.value.expired is (type(exp) is float)


@pytest.mark.parametrize(
    ("header", "payload"),
    [
        ('{"alg":"HS256","typ":"JWT"}', '{"sub":"alice","sub":"mallory","exp":EXP}'),
        ('{"alg":"HS256","typ":"JWT"}', '{"sub":"alice","exp":EXP,"exp":EXP}'),
        ('{"alg":"HS256","alg":"HS256"}', '{"sub":"alice","exp":EXP}'),
        ('{"alg":"HS256","typ":"JWT"}', '{"sub":"alice","exp":EXP,"x":{"a":1,"a":2}}'),
    ],
)
async def test_repeated_names_in_header_or_claims_are_refused(header: str, payload: str) -> None:
    raw = _encode_raw(header, payload.replace("EXP", str(int(time.time()) + 60)))
    with pytest.raises(InvalidToken) as refused:
        await TokenVerifier(SETTINGS).verify(f"Bearer {raw}")
    assert refused.value.reason == "repeated member name"


async def test_the_raw_encoder_makes_tokens_that_verify_without_repeats() -> None:
    raw = _encode_raw('{"alg":"HS256","typ":"JWT"}', f'{{"sub":"alice","exp":{int(time.time()) + 60}}}')
    assert (await TokenVerifier(SETTINGS).verify(f"Bearer {raw}")).user_id == "alice"


async def test_a_token_living_longer_than_the_maximum_is_refused() -> None:
    now = int(time.time())
    verifier = TokenVerifier(SETTINGS)
    longest = SETTINGS.jwt_max_lifetime_seconds
    assert longest == 24 * 3600
    assert (await verifier.verify(f"Bearer {token(valid_claims(exp=now + longest))}")).user_id == "alice"
    for exp in (now + longest + 3600, 10**30):
        with pytest.raises(InvalidToken) as refused:
            await verifier.verify(f"Bearer {token(valid_claims(exp=exp))}")
        assert refused.value.reason == "lifetime over the maximum"


def test_minting_refuses_a_lifetime_the_api_would_refuse() -> None:
    with pytest.raises(ValueError, match="at most"):
        mint_token(SETTINGS, user_id="alice", ttl_seconds=SETTINGS.jwt_max_lifetime_seconds + 1)


class Clock:
    """A clock a test moves by hand (seconds since the epoch)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def test_a_remembered_token_skips_the_signature_only_before_its_exp(monkeypatch: pytest.MonkeyPatch) -> None:
    decodes: list[str] = []
    real_decode = jwt.decode

    def counted(raw: str, *args: Any, **kwargs: Any) -> Any:
        decodes.append(raw)
        return real_decode(raw, *args, **kwargs)

    monkeypatch.setattr(jwt, "decode", counted)
    clock = Clock()
    verifier = TokenVerifier(SETTINGS, clock=clock)
    exp = int(clock.now) + 60
    header = f"Bearer {token(valid_claims(exp=exp))}"
    assert (await verifier.verify(header)).user_id == (await verifier.verify(header)).user_id == "alice"
    assert len(decodes) == 1
    clock.now = exp  # at exp the remembered answer no longer counts: every check runs again
    await verifier.verify(header)
    assert len(decodes) == 2


async def test_a_remembered_token_is_refused_once_it_has_expired() -> None:
    verifier = TokenVerifier(Settings(jwt_secret=SECRET, jwt_leeway_seconds=0))
    exp = int(time.time()) + 1
    header = f"Bearer {token(valid_claims(exp=exp))}"
    assert (await verifier.verify(header)).user_id == "alice"
    await wait_for(lambda: time.time() > exp + 0.01, timeout=5)
    with pytest.raises(InvalidToken) as refused:
        await verifier.verify(header)
    assert refused.value.expired


async def test_refusals_are_never_remembered() -> None:
    clock = Clock()
    verifier = TokenVerifier(SETTINGS, clock=clock)
    header = f"Bearer {token(valid_claims(nbf=int(clock.now) + 3600))}"
    with pytest.raises(InvalidToken):
        await verifier.verify(header)
    with pytest.raises(InvalidToken):
        await verifier.verify(header)
    forged = f"Bearer {token(valid_claims(), key='another-secret-also-at-least-32-bytes')}"
    for _ in range(2):
        with pytest.raises(InvalidToken):
            await verifier.verify(forged)
