"""Bearer tokens (docs/api.md: Tokens and keys, Authentication): verification for the API and minting for
development."""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

import jwt
from prometheus_client import Counter

from shared.ids import is_valid_id
from shared.jwks import KeySource, VerificationKey, key_source
from shared.recent import RecentlyUsed
from shared.settings import TokenSettings

# What a refusal counts as on ``chatexport_tokens_refused_total``: a bounded set, unlike the logged reason.
REFUSAL_KINDS = ("missing", "malformed", "algorithm", "key", "signature", "expired", "claims")

TOKENS_REFUSED = Counter(
    "chatexport_tokens_refused_total",
    "Bearer tokens refused, by kind: missing, malformed, algorithm (not allowed, none), key (no key for its kid"
    " or of its type), signature, expired, claims (iss, aud, azp, the user, the lifetime)",
    ["kind"],
)


class InvalidToken(Exception):
    """The token is missing, malformed, expired, badly signed or carries an unusable user claim.

    ``reason`` names the check that failed, for the log (never the token); ``kind`` is one of
    ``REFUSAL_KINDS``, for the metric; ``expired`` is True only for a token whose signature verified and whose
    ``exp`` has passed, the one failure a client may be told of (docs/api.md: Tokens and keys, Authentication).
    """

    def __init__(self, reason: str, *, kind: str = "claims", expired: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.expired = expired


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: ``user_id`` from the user claim (``sub`` by default), the scopes from
    ``scope``, and ``is_admin`` from the admin claim (``jwt_admin_claim`` holding ``jwt_admin_value``).
    """

    user_id: str
    scopes: frozenset[str]
    is_admin: bool


# Verified tokens a verifier remembers, at most; the least recently used go first.
VERIFIED_TOKENS_KEPT = 10_000


class TokenVerifier:
    """Checks tokens against the keys of ``keys`` (``shared.jwks``; by default the source the settings name):
    HS256 against the secret, or an algorithm of ``jwt_algorithms`` against a public key (docs/keys.md:
    Connect your identity provider).

    A token that passed every check is remembered (at most ``VERIFIED_TOKENS_KEPT``) until its ``exp`` by
    ``clock`` (seconds since the epoch), so a client polling with one token pays for its signature once.
    Safe because a verified token's answer can only change with time or the key: entries are used only
    before ``exp`` (past it the full check runs, and refuses it as expired once the leeway is over) and only
    while the key that verified it is still held (a key the identity provider removed ends its tokens'
    entries), and only tokens that passed are stored (a refusal is never remembered, so a token not yet
    valid by ``nbf`` or ``iat`` is checked again).
    """

    def __init__(
        self, settings: TokenSettings, *, keys: KeySource | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.keys: KeySource = keys if keys is not None else key_source(settings)
        self._algorithms = settings.public_key_algorithms if settings.uses_public_keys else ["HS256"]
        self._issuer = settings.jwt_issuer
        self._audience = settings.jwt_audience
        self._parties = settings.authorized_parties
        self._user_claim = settings.jwt_user_claim
        self._admin_claim = settings.jwt_admin_claim.split(".")
        self._admin_value = settings.jwt_admin_value
        self._leeway = settings.jwt_leeway_seconds
        self._max_lifetime = settings.jwt_max_lifetime_seconds
        self._clock = clock
        # token -> (principal, exp, the fingerprint of the key that verified it)
        self._verified: RecentlyUsed[str, tuple[Principal, float, str]] = RecentlyUsed(VERIFIED_TOKENS_KEPT)

    async def verify(self, authorization: str | None) -> Principal:
        """Return the principal of an ``Authorization: Bearer <JWT>`` header value.

        ``iat``, ``nbf`` and ``exp`` are judged with ``jwt_leeway_seconds`` of clock skew either way, and an
        ``exp`` more than ``jwt_max_lifetime_seconds`` (plus the leeway) ahead is refused, so that nobody
        holding the key can mint a token that never expires (docs/api.md: Tokens and keys, Authentication).
        Raises ``InvalidToken`` for any failure, having counted it.
        """
        try:
            return await self._verify(authorization)
        except InvalidToken as refusal:
            TOKENS_REFUSED.labels(refusal.kind).inc()
            raise

    async def _verify(self, authorization: str | None) -> Principal:
        if not authorization:
            raise InvalidToken("missing", kind="missing")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise InvalidToken("not a bearer token", kind="missing")
        remembered = self._verified.get(token)
        if remembered is not None and self._clock() < remembered[1] and self.keys.holds(remembered[2]):
            return remembered[0]
        self._verified.forget(token)
        principal, exp, fingerprint = await self._check(token)
        self._verified.put(token, (principal, exp, fingerprint))
        return principal

    async def _check(self, token: str) -> tuple[Principal, float, str]:
        """Every check of ``verify`` on the token itself: its principal, ``exp`` and the key's fingerprint. The
        header's ``alg`` must be allowed and its ``kid`` picks the key; headers that name a key from elsewhere
        (``jku``, ``x5u``, ``jwk``, ``x5c``: RFC 7515 4.1) are never followed nor used.
        """
        header, unverified = _unverified_parts(token)
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self._algorithms:
            raise InvalidToken("algorithm not allowed", kind="algorithm")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise InvalidToken("bad kid", kind="malformed")
        candidates = [key for key in await self.keys.keys_for(kid) if key.verifies(alg)]
        if not candidates:
            raise InvalidToken("no key for the token", kind="key")
        for key in candidates:
            try:
                claims = self._decode(token, key, alg, unverified)
            except InvalidToken as refusal:
                if refusal.kind == "signature" and key is not candidates[-1]:
                    continue  # a kid-less token tried against the next static key
                raise
            latest_exp = self._clock() + self._max_lifetime + self._leeway
            return self._principal(claims, latest_exp=latest_exp), claims["exp"], key.fingerprint
        raise AssertionError("unreachable: the last candidate returns or raises")

    def _decode(self, token: str, key: VerificationKey, alg: str, unverified: dict[str, Any]) -> dict[str, Any]:
        """The claims of ``token`` verified with ``key`` by PyJWT; raises ``InvalidToken``."""
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                issuer=self._issuer,
                audience=self._audience,
                leeway=self._leeway,
                options={"require": ["exp", self._user_claim], "verify_aud": self._audience is not None},
            )
        except jwt.ExpiredSignatureError:
            # PyJWT checks the claims only after the signature verified: this token is genuine and, when
            # its exp is a NumericDate, old. PyJWT also reads "1000" or true as an exp in the past.
            if not _is_numeric_date(unverified.get("exp")):
                raise InvalidToken("bad exp") from None
            raise InvalidToken("ExpiredSignatureError", kind="expired", expired=True) from None
        except (jwt.InvalidSignatureError, jwt.InvalidKeyError) as exc:
            raise InvalidToken(type(exc).__name__, kind="signature") from None
        except jwt.DecodeError as exc:
            raise InvalidToken(type(exc).__name__, kind="malformed") from None
        except jwt.PyJWTError as exc:
            raise InvalidToken(type(exc).__name__) from None
        return claims

    def _principal(self, claims: dict[str, Any], *, latest_exp: float) -> Principal:
        exp = claims.get("exp")
        if not _is_numeric_date(exp):
            raise InvalidToken("bad exp")
        if exp > latest_exp:
            raise InvalidToken("lifetime over the maximum")
        azp = claims.get("azp")
        if self._parties is not None and not (isinstance(azp, str) and azp in self._parties):
            raise InvalidToken("azp not allowed")
        user = claims.get(self._user_claim)
        if not isinstance(user, str) or not is_valid_id(user):
            raise InvalidToken("bad sub")
        scope = claims.get("scope", "")
        if not isinstance(scope, str):
            raise InvalidToken("bad scope")
        return Principal(
            user_id=user, scopes=_scopes(scope), is_admin=self._admin_value in _names(claims, self._admin_claim)
        )


def _names(claims: dict[str, Any], path: list[str]) -> frozenset[str]:
    """The names the claim at ``path`` holds: a string's scope tokens, or a list's strings; none otherwise."""
    value: Any = claims
    for step in path:
        value = value.get(step) if isinstance(value, dict) else None
    if isinstance(value, str):
        return _scopes(value)
    if isinstance(value, list):
        return frozenset(item for item in value if isinstance(item, str))
    return frozenset()


def _unverified_parts(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The JOSE header and claims set of ``token`` before any verification, having refused (``InvalidToken``)
    one that repeats a member name: JSON parsers disagree on which one wins (RFC 7519 section 4 lets a parser
    reject it), so ``sub`` twice could name two users. Never trust what it returns.
    """
    segments = token.split(".")
    if len(segments) != 3:
        raise InvalidToken("not three segments", kind="malformed")
    parts: list[dict[str, Any]] = []
    for segment in segments[:2]:
        try:
            decoded = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
            members = json.loads(decoded, object_pairs_hook=_unique)
        except _RepeatedName:
            raise InvalidToken("repeated member name", kind="malformed") from None
        except (binascii.Error, ValueError, RecursionError):
            raise InvalidToken("undecodable segment", kind="malformed") from None
        parts.append(members if isinstance(members, dict) else {})
    return parts[0], parts[1]


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
