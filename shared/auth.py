"""Bearer tokens (docs/api.md: Tokens and keys, Authentication): verification for the API and minting for
development."""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

import jwt

from shared.ids import is_valid_id
from shared.settings import TokenSettings


class InvalidToken(Exception):
    """The token is missing, malformed, expired, badly signed or carries an unusable ``sub``.

    ``reason`` names the check that failed, for the log (never the token); ``expired`` is True only for a
    token whose signature verified and whose ``exp`` has passed, the one failure a client may be told of
    (docs/api.md: Tokens and keys, Authentication).
    """

    def __init__(self, reason: str, *, expired: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.expired = expired


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: ``user_id`` from ``sub`` and the scopes from ``scope``."""

    user_id: str
    scopes: frozenset[str]

    @property
    def is_admin(self) -> bool:
        """True when the token carries the ``admin`` scope (docs/api.md: API reference)."""
        return "admin" in self.scopes


# Verified tokens a verifier remembers, at most; the least recently used go first.
VERIFIED_TOKENS_KEPT = 10_000


class TokenVerifier:
    """Checks HS256 tokens against the secret, or RS256/ES256 against a public key when one is set.

    A token that passed every check is remembered (at most ``VERIFIED_TOKENS_KEPT``) until its ``exp`` by
    ``clock`` (seconds since the epoch), so a client polling with one token pays for its signature once.
    Safe because a verified token's answer can only change with time or the key: entries are used only
    before ``exp`` (past it the full check runs, and refuses it as expired once the leeway is over), only
    tokens that passed are stored (a refusal is never remembered, so a token not yet valid by ``nbf`` or
    ``iat`` is checked again), and the cache lives in this verifier, which holds one key: a new key means a
    new verifier (a restart).
    """

    def __init__(self, settings: TokenSettings, *, clock: Callable[[], float] = time.time) -> None:
        if settings.jwt_public_key:
            self._key: str = settings.jwt_public_key
            self._algorithms = ["RS256", "ES256"]
        else:
            self._key = settings.jwt_secret
            self._algorithms = ["HS256"]
        self._issuer = settings.jwt_issuer
        self._audience = settings.jwt_audience
        self._leeway = settings.jwt_leeway_seconds
        self._max_lifetime = settings.jwt_max_lifetime_seconds
        self._clock = clock
        self._verified: OrderedDict[str, tuple[Principal, float]] = OrderedDict()

    def verify(self, authorization: str | None) -> Principal:
        """Return the principal of an ``Authorization: Bearer <JWT>`` header value.

        ``iat``, ``nbf`` and ``exp`` are judged with ``jwt_leeway_seconds`` of clock skew either way, and an
        ``exp`` more than ``jwt_max_lifetime_seconds`` (plus the leeway) ahead is refused, so that nobody
        holding the key can mint a token that never expires (docs/api.md: Tokens and keys, Authentication). Raises
        ``InvalidToken`` for any failure.
        """
        if not authorization:
            raise InvalidToken("missing")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise InvalidToken("not a bearer token")
        remembered = self._verified.get(token)
        if remembered is not None and self._clock() < remembered[1]:
            self._verified.move_to_end(token)
            return remembered[0]
        self._verified.pop(token, None)
        principal, exp = self._check(token)
        self._verified[token] = (principal, exp)
        if len(self._verified) > VERIFIED_TOKENS_KEPT:
            self._verified.popitem(last=False)
        return principal

    def _check(self, token: str) -> tuple[Principal, float]:
        """Every check of ``verify`` on the token itself: its principal and ``exp``."""
        unverified = _unverified_claims(token)
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=self._algorithms,
                issuer=self._issuer,
                audience=self._audience,
                leeway=self._leeway,
                options={"require": ["exp", "sub"], "verify_aud": self._audience is not None},
            )
        except jwt.ExpiredSignatureError:
            # PyJWT checks the claims only after the signature verified: this token is genuine and, when
            # its exp is a NumericDate, old. PyJWT also reads "1000" or true as an exp in the past.
            if not _is_numeric_date(unverified.get("exp")):
                raise InvalidToken("bad exp") from None
            raise InvalidToken("ExpiredSignatureError", expired=True) from None
        except jwt.PyJWTError as exc:
            raise InvalidToken(type(exc).__name__) from None
        return _principal(claims, latest_exp=self._clock() + self._max_lifetime + self._leeway), claims["exp"]


def _unverified_claims(token: str) -> dict[str, Any]:
    """The claims set of ``token`` before any verification, having refused (``InvalidToken``) a JOSE header
    or claims set that repeats a member name: JSON parsers disagree on which one wins (RFC 7519 section 4
    lets a parser reject it), so ``sub`` twice could name two users. Never trust what it returns.
    """
    segments = token.split(".")
    if len(segments) != 3:
        raise InvalidToken("not three segments")
    members: Any = None
    for segment in segments[:2]:
        try:
            decoded = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
            members = json.loads(decoded, object_pairs_hook=_unique)
        except _RepeatedName:
            raise InvalidToken("repeated member name") from None
        except (binascii.Error, ValueError, RecursionError):
            raise InvalidToken("undecodable segment") from None
    return members if isinstance(members, dict) else {}


def _is_numeric_date(value: object) -> TypeGuard[int | float]:
    """RFC 7519 section 2: a NumericDate is a JSON number (PyJWT would also take a numeric string)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


class _RepeatedName(Exception):
    """A JSON object of the token repeats a member name."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):
        raise _RepeatedName
    return members


def _principal(claims: dict[str, object], *, latest_exp: float) -> Principal:
    exp = claims.get("exp")
    if not _is_numeric_date(exp):
        raise InvalidToken("bad exp")
    if exp > latest_exp:
        raise InvalidToken("lifetime over the maximum")
    sub = claims.get("sub")
    if not isinstance(sub, str) or not is_valid_id(sub):
        raise InvalidToken("bad sub")
    scope = claims.get("scope", "")
    if not isinstance(scope, str):
        raise InvalidToken("bad scope")
    return Principal(user_id=sub, scopes=_scopes(scope))


def _scopes(scope: str) -> frozenset[str]:
    """The scope tokens of a ``scope`` claim, split on U+0020 alone (RFC 6749 section 3.3; docs/api.md: API
    reference, Authentication): a tab, a no-break space or any other white space is part of a token, so
    ``"admin\tuser"`` is one scope that is not ``admin``. Empty tokens (two spaces in a row) count for nothing.
    """
    return frozenset(token for token in scope.split(" ") if token)


def mint_token(
    settings: TokenSettings, *, user_id: str, scopes: list[str] | None = None, ttl_seconds: int = 3600
) -> str:
    """Sign an HS256 development token for ``user_id`` valid for ``ttl_seconds`` (docs/command-line.md: Command line).

    Raises ``ValueError`` when ``ttl_seconds`` is over ``jwt_max_lifetime_seconds``: the API would refuse it.
    """
    if ttl_seconds > settings.jwt_max_lifetime_seconds:
        raise ValueError(
            f"a token may live at most {settings.jwt_max_lifetime_seconds} s (CHATEXPORT_JWT_MAX_LIFETIME_SECONDS)"
        )
    now = int(time.time())
    claims: dict[str, object] = {"sub": user_id, "iat": now, "exp": now + ttl_seconds}
    if scopes:
        claims["scope"] = " ".join(scopes)
    if settings.jwt_issuer:
        claims["iss"] = settings.jwt_issuer
    if settings.jwt_audience:
        claims["aud"] = settings.jwt_audience
    return jwt.encode(claims, settings.jwt_secret, algorithm="HS256")
