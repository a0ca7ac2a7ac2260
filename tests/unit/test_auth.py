"""Bearer token verification (contract section 2)."""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from shared.auth import InvalidToken, TokenVerifier, mint_token
from shared.settings import Settings

SECRET = "unit-test-secret-of-at-least-32-bytes"
SETTINGS = Settings(jwt_secret=SECRET)


def token(claims: dict[str, Any], *, key: Any = SECRET, algorithm: str = "HS256") -> str:
    return jwt.encode(claims, key, algorithm=algorithm)


def valid_claims(**changes: Any) -> dict[str, Any]:
    claims: dict[str, Any] = {"sub": "alice", "exp": int(time.time()) + 60}
    claims.update(changes)
    return {key: value for key, value in claims.items() if value is not None}


def test_a_minted_token_verifies_with_its_scopes() -> None:
    verifier = TokenVerifier(SETTINGS)
    principal = verifier.verify(f"Bearer {mint_token(SETTINGS, user_id='u.1:x-y_z', scopes=['admin', 'read'])}")
    assert principal.user_id == "u.1:x-y_z"
    assert principal.is_admin
    assert principal.scopes == {"admin", "read"}
    assert not verifier.verify(f"bearer {mint_token(SETTINGS, user_id='bob')}").is_admin


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Basic YWxpY2U6c2VjcmV0",
        "Bearer not.a.jwt",
        f"Bearer {token(valid_claims(exp=int(time.time()) - 10))}",
        f"Bearer {token(valid_claims(), key='another-secret-also-at-least-32-bytes')}",
        f"Bearer {token(valid_claims(exp=None))}",
        f"Bearer {token(valid_claims(sub=None))}",
        f"Bearer {token(valid_claims(exp='99999999999'))}",
        f"Bearer {token(valid_claims(sub='has space'))}",
        f"Bearer {token(valid_claims(sub='x' * 65))}",
        f"Bearer {token(valid_claims(sub=42))}",
        f"Bearer {token(valid_claims(scope=['admin']))}",
        f"Bearer {token(valid_claims(), key=SECRET * 2, algorithm='HS512')}",
        f"Bearer {jwt.encode(valid_claims(), '', algorithm='none')}",
    ],
)
def test_invalid_tokens_are_refused(header: str | None) -> None:
    with pytest.raises(InvalidToken):
        TokenVerifier(SETTINGS).verify(header)


def test_issuer_and_audience_are_checked_when_configured() -> None:
    settings = Settings(
        jwt_secret="unit-test-secret-of-at-least-32-bytes", jwt_issuer="https://issuer", jwt_audience="chatexport"
    )
    verifier = TokenVerifier(settings)
    assert verifier.verify(f"Bearer {mint_token(settings, user_id='alice')}").user_id == "alice"
    for claims in (valid_claims(iss="https://other", aud="chatexport"), valid_claims(iss="https://issuer")):
        with pytest.raises(InvalidToken):
            verifier.verify(f"Bearer {token(claims)}")


def test_es256_with_a_configured_public_key() -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    verifier = TokenVerifier(Settings(jwt_public_key=public_pem.decode()))
    assert verifier.verify(f"Bearer {token(valid_claims(), key=private, algorithm='ES256')}").user_id == "alice"
    with pytest.raises(InvalidToken):
        verifier.verify(f"Bearer {token(valid_claims())}")  # HS256 is not accepted once a key is configured
