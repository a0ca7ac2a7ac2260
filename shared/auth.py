"""Bearer tokens (contract section 2): verification for the API and minting for development."""

from __future__ import annotations

import time
from dataclasses import dataclass

import jwt

from shared.ids import is_valid_id
from shared.settings import Settings


class InvalidToken(Exception):
    """The token is missing, malformed, expired, badly signed or carries an unusable ``sub``."""


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: ``user_id`` from ``sub`` and the scopes from ``scope``."""

    user_id: str
    scopes: frozenset[str]

    @property
    def is_admin(self) -> bool:
        """True when the token carries the ``admin`` scope (contract 2)."""
        return "admin" in self.scopes


class TokenVerifier:
    """Checks HS256 tokens against the secret, or RS256/ES256 against a public key when one is set."""

    def __init__(self, settings: Settings) -> None:
        if settings.jwt_public_key:
            self._key: str = settings.jwt_public_key
            self._algorithms = ["RS256", "ES256"]
        else:
            self._key = settings.jwt_secret
            self._algorithms = ["HS256"]
        self._issuer = settings.jwt_issuer
        self._audience = settings.jwt_audience

    def verify(self, authorization: str | None) -> Principal:
        """Return the principal of an ``Authorization: Bearer <JWT>`` header value.

        Raises ``InvalidToken`` for any failure; the reason is never shown to the caller.
        """
        if not authorization:
            raise InvalidToken("missing")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise InvalidToken("not a bearer token")
        try:
            claims = jwt.decode(
                token.strip(),
                self._key,
                algorithms=self._algorithms,
                issuer=self._issuer,
                audience=self._audience,
                options={"require": ["exp", "sub"], "verify_aud": self._audience is not None},
            )
        except jwt.PyJWTError as exc:
            raise InvalidToken(type(exc).__name__) from None
        return _principal(claims)


def _principal(claims: dict[str, object]) -> Principal:
    exp = claims.get("exp")
    # PyJWT casts a numeric string; RFC 7519 makes exp a NumericDate, so anything else is malformed.
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        raise InvalidToken("bad exp")
    sub = claims.get("sub")
    if not isinstance(sub, str) or not is_valid_id(sub):
        raise InvalidToken("bad sub")
    scope = claims.get("scope", "")
    if not isinstance(scope, str):
        raise InvalidToken("bad scope")
    return Principal(user_id=sub, scopes=frozenset(scope.split()))


def mint_token(settings: Settings, *, user_id: str, scopes: list[str] | None = None, ttl_seconds: int = 3600) -> str:
    """Sign an HS256 development token for ``user_id`` valid for ``ttl_seconds`` (contract 2: the CLI)."""
    now = int(time.time())
    claims: dict[str, object] = {"sub": user_id, "iat": now, "exp": now + ttl_seconds}
    if scopes:
        claims["scope"] = " ".join(scopes)
    if settings.jwt_issuer:
        claims["iss"] = settings.jwt_issuer
    if settings.jwt_audience:
        claims["aud"] = settings.jwt_audience
    return jwt.encode(claims, settings.jwt_secret, algorithm="HS256")
