"""The keys that verify bearer tokens (docs/keys.md: Connect your identity provider): the HS256 secret, static
public keys (PEM files or a JWKS file), or a JWKS fetched from the identity provider and kept fresh.

A fetched JWKS is kept for its ``Cache-Control: max-age`` clamped to ``jwks_min_cache_seconds`` ..
``jwks_max_cache_seconds`` (``jwks_default_cache_seconds`` without one) and refreshed in the background before
then. A ``kid`` the set does not hold triggers a fetch, one at a time (single flight) and at most one per
``jwks_unknown_kid_cooldown_seconds``: within the cool-down every unknown ``kid`` is refused at once, so
forged ones cost nothing, and nothing is kept per ``kid``. A failed fetch keeps the keys it had, for at most
``jwks_max_stale_seconds`` after the last good one: an identity provider's blip is no outage. A key the
provider removed stops verifying at the next refresh. PyJWT parses the set and verifies; the fetching is
aiohttp's, on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from prometheus_client import Counter, Gauge

from shared.settings import TokenSettings, is_remote_key_url, outside_development

log = logging.getLogger(__name__)

JWKS_FETCHES = Counter(
    "chatexport_jwks_fetches_total",
    "Fetches of the identity provider's JWKS (and discovery document), by outcome: ok, failed, refused"
    " (an answer that is not a usable key set)",
    ["outcome"],
)
JWKS_AGE = Gauge("chatexport_jwks_age_seconds", "Seconds since the JWKS in use was fetched; 0 for static keys")
JWKS_KEYS = Gauge("chatexport_jwks_keys", "Keys the API verifies tokens with")

# The members of a private JWK (RFC 7518 6.2.2, 6.3.2, 6.4.1; RFC 8037 2): a published set never holds them.
PRIVATE_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})
# The largest JWKS or discovery document read; real ones are a few KiB.
MAX_DOCUMENT_BYTES = 1024 * 1024
# A refresh is due this share of the way through the set's lifetime, so that it lands before the end.
REFRESH_AT = 0.8
# The first wait after a failed fetch, doubled up to the cool-down.
FIRST_RETRY_SECONDS = 1.0

# The key type (and curve) each algorithm verifies with (RFC 7518 3.1, RFC 8037 3.1).
KEY_TYPES: dict[str, tuple[str, str | None]] = {
    **{f"{family}{bits}": ("RSA", None) for family in ("RS", "PS") for bits in (256, 384, 512)},
    "ES256": ("EC", "P-256"),
    "ES384": ("EC", "P-384"),
    "ES512": ("EC", "P-521"),
    "EdDSA": ("OKP", "Ed25519"),
    "HS256": ("oct", None),
}


class KeySetError(Exception):
    """A key set, a key file or a discovery document that cannot be used; the message says why."""


@dataclass(frozen=True)
class VerificationKey:
    """One key: its ``kid`` (None for a PEM file or the secret), ``kty`` (``RSA``, ``EC``, ``OKP`` or ``oct``
    for the secret) and ``crv``, its own ``alg`` and ``use`` when it names them, the ``key`` PyJWT verifies
    with, and a ``fingerprint`` that tells it from every other key.
    """

    kid: str | None
    kty: str
    crv: str | None
    alg: str | None
    use: str | None
    key: Any
    fingerprint: str

    def verifies(self, alg: str) -> bool:
        """Whether a token signed with ``alg`` may be verified with this key: the key's type and curve are the
        algorithm's, its ``alg`` (if any) is ``alg``, and its ``use`` (if any) is ``sig``.
        """
        expected = KEY_TYPES.get(alg)
        return (
            expected is not None
            and (self.kty, self.crv if expected[1] else None) == expected
            and self.alg in (None, alg)
            and self.use in (None, "sig")
        )


@dataclass(frozen=True)
class KeySet:
    """The keys in use and when they were fetched (``fetched_at``, the source's clock; None for static
    keys)."""

    keys: tuple[VerificationKey, ...]
    fetched_at: float | None = None

    def with_kid(self, kid: str | None, *, static: bool = False) -> list[VerificationKey]:
        """The keys a token with ``kid`` may be tried against (docs/keys.md: Which key verifies a token): those
        with that ``kid``, and for ``static`` keys those without one (a PEM file names none); for a token
        without a ``kid``, every static key, or a fetched set's one key when it holds exactly one.
        """
        if kid is not None:
            return [key for key in self.keys if key.kid == kid or (static and key.kid is None)]
        return list(self.keys) if static or len(self.keys) == 1 else []

    @functools.cached_property
    def fingerprints(self) -> frozenset[str]:
        """The fingerprints of the keys, computed once: every remembered token's request asks for them."""
        return frozenset(key.fingerprint for key in self.keys)


def secret_key(secret: str) -> VerificationKey:
    """The HS256 secret as a key."""
    return VerificationKey(None, "oct", None, "HS256", "sig", secret, _digest(secret.encode()))


def parse_jwks(document: object) -> tuple[VerificationKey, ...]:
    """The usable public keys of a JWKS (RFC 7517 5: ``{"keys": [...]}``); a member PyJWT cannot read, or a
    symmetric one (``oct``: a shared secret has no place in a published set), is left out. Raises
    ``KeySetError`` when none is usable.
    """
    members = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(members, list):
        raise KeySetError("not a JWKS: no keys list")
    keys = []
    for member in members:
        if not isinstance(member, dict) or member.get("kty") == "oct" or PRIVATE_MEMBERS & member.keys():
            continue
        kid, alg, use, crv = (member.get(name) for name in ("kid", "alg", "use", "crv"))
        if not all(value is None or isinstance(value, str) for value in (kid, alg, use, crv)):
            continue
        try:
            parsed = jwt.PyJWK(member)
        except Exception:  # noqa: S112 - a member PyJWT cannot read, whatever it raises, is left out
            continue
        # The whole member, so that a key republished with another kid, alg or use verifies nothing the API
        # remembered under the old one.
        fingerprint = _digest(json.dumps(member, sort_keys=True).encode())
        keys.append(VerificationKey(kid, str(member["kty"]), crv, alg, use, parsed.key, fingerprint))
    if not keys:
        raise KeySetError("the JWKS holds no usable public key")
    return tuple(keys)


def read_key_files(paths: Iterable[str]) -> tuple[VerificationKey, ...]:
    """The keys of PEM public key files and JWKS files (``.json``). Raises ``KeySetError`` for a file that
    cannot be read or holds no usable public key.
    """
    keys: list[VerificationKey] = []
    for path in paths:
        try:
            data = Path(path).read_bytes()
            if path.endswith(".json"):
                keys.extend(parse_jwks(json.loads(data)))
            else:
                keys.append(_pem_key(data))
        except Exception as exc:  # whatever a file holds, it is refused with its name
            raise KeySetError(f"the key file {path} cannot be used: {type(exc).__name__}") from None
    return tuple(keys)


def _pem_key(data: bytes) -> VerificationKey:
    """A PEM public key; raises ``ValueError`` for anything else (a private key, a certificate, an HMAC key)."""
    key = serialization.load_pem_public_key(data)
    fingerprint = _digest(key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))
    if isinstance(key, rsa.RSAPublicKey):
        return VerificationKey(None, "RSA", None, None, None, key, fingerprint)
    if isinstance(key, ec.EllipticCurvePublicKey):
        curve = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}.get(key.curve.name)
        return VerificationKey(None, "EC", curve, None, None, key, fingerprint)
    if isinstance(key, ed25519.Ed25519PublicKey):
        return VerificationKey(None, "OKP", "Ed25519", None, None, key, fingerprint)
    raise ValueError(f"unsupported key type {type(key).__name__}")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class KeySource(Protocol):
    """Where a verifier finds its keys."""

    async def keys_for(self, kid: str | None) -> list[VerificationKey]:
        """The keys a token with ``kid`` may be tried against; empty when none."""
        ...

    def holds(self, fingerprint: str) -> bool:
        """Whether the key with ``fingerprint`` still verifies (the verified-token cache asks)."""
        ...


class StaticKeys:
    """Keys fixed at start-up: the secret, one PEM key, or key files."""

    def __init__(self, keys: tuple[VerificationKey, ...]) -> None:
        self._set = KeySet(keys)
        JWKS_KEYS.set(len(keys))
        JWKS_AGE.set(0)

    async def keys_for(self, kid: str | None) -> list[VerificationKey]:
        """The keys for ``kid`` (``KeySet.with_kid``, static)."""
        return self._set.with_kid(kid, static=True)

    def holds(self, fingerprint: str) -> bool:
        """Always True: static keys never go."""
        return True


# (url, timeout seconds) -> (the parsed JSON document, its max-age in seconds or None); raises on failure.
Fetch = Callable[[str, float], Awaitable[tuple[object, float | None]]]


class KeysUnavailable(Exception):
    """No key set has been fetched yet, or the last one is older than ``jwks_max_stale_seconds``."""


class RemoteKeys:
    """A JWKS fetched from ``jwt_jwks_url`` (or from the URL the issuer's discovery document names) and kept
    fresh (see the module's docstring): ``run()`` loads it and refreshes it until cancelled. ``clock`` is
    monotonic seconds; ``fetch`` is aiohttp's (``fetch_json``) unless a test brings its own.
    """

    def __init__(
        self,
        settings: TokenSettings,
        *,
        fetch: Fetch | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._jwks_url = settings.jwt_jwks_url
        self._fetch = fetch or fetch_json
        self._clock = clock
        self._set = KeySet(())
        self._refresh_at = 0.0
        self._last_kid_fetch: float | None = None  # when a kid the set did not hold last caused a fetch
        self._fetching: asyncio.Future[None] | None = None

    async def keys_for(self, kid: str | None) -> list[VerificationKey]:
        """The keys for ``kid`` in the current set; for a ``kid`` it does not hold, after at most one fetch
        (shared with any other caller waiting for one; none within the cool-down of the last one an unknown ``kid``
        caused).
        Empty when none, and when the set is older than ``jwks_max_stale_seconds``.
        """
        keys = self._current().with_kid(kid)
        if keys or kid is None:
            return keys
        now = self._clock()
        if self._fetching is not None:
            await self.refresh()
        elif (
            self._last_kid_fetch is None
            or now - self._last_kid_fetch >= self._settings.jwks_unknown_kid_cooldown_seconds
        ):
            self._last_kid_fetch = now
            await self.refresh()
        return self._current().with_kid(kid)

    @property
    def next_refresh_at(self) -> float:
        """When (by ``clock``) the background refresh fetches the set again: ``REFRESH_AT`` of its lifetime."""
        return self._refresh_at

    def holds(self, fingerprint: str) -> bool:
        """Whether the current, fresh enough set holds the key with ``fingerprint``."""
        return fingerprint in self._current().fingerprints

    async def check(self) -> None:
        """The readiness check: raises ``KeysUnavailable`` until a set is in, and once it is too stale."""
        if not self._current().keys:
            raise KeysUnavailable

    async def refresh(self) -> bool:
        """Fetch the set now, or wait for the fetch already under way (single flight); True when it succeeded.
        A failure keeps the keys there were.
        """
        if self._fetching is None:
            self._fetching = asyncio.ensure_future(self._fetch_set())
            self._fetching.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            await asyncio.shield(self._fetching)
        except Exception:  # counted and logged where it was raised; the old keys stay
            return False
        return True

    async def run(self) -> None:
        """Load the set, retrying with backoff (up to the cool-down) until it is in, then refresh it
        ``REFRESH_AT`` of the way through its lifetime, keeping the old keys through failures; until cancelled.
        """
        retry = FIRST_RETRY_SECONDS
        while True:
            if self._clock() >= self._refresh_at:
                if not await self.refresh():
                    await asyncio.sleep(retry)
                    retry = min(retry * 2, self._settings.jwks_unknown_kid_cooldown_seconds)
                    continue
                retry = FIRST_RETRY_SECONDS
            await asyncio.sleep(max(self._refresh_at - self._clock(), 0.0))

    def _current(self) -> KeySet:
        """The set in use, or an empty one before the first load and once it is too stale."""
        if self._set.fetched_at is None:
            return self._set
        age = self._clock() - self._set.fetched_at
        JWKS_AGE.set(age)
        return KeySet(()) if age > self._settings.jwks_max_stale_seconds else self._set

    async def _fetch_set(self) -> None:
        """Fetch the set once (discovering its URL first when needed); raises what the fetch raised."""
        try:
            url = self._jwks_url or await self._discover()
            document, max_age = await self._fetch(url, self._settings.jwks_fetch_timeout_seconds)
            keys = parse_jwks(document)
        except KeySetError as exc:
            JWKS_FETCHES.labels("refused").inc()
            log.warning("key set refused", extra={"error": str(exc)})
            raise
        except Exception as exc:
            # Whatever the answer or the connection did, the background refresh must go on: only the
            # cancellation of a stopping part ends it (CancelledError is no Exception).
            JWKS_FETCHES.labels("failed").inc()
            log.warning("key set fetch failed; the cached keys stay", extra={"error": type(exc).__name__})
            raise
        finally:
            self._fetching = None
        JWKS_FETCHES.labels("ok").inc()
        now = self._clock()
        self._set = KeySet(keys, fetched_at=now)
        # Before the set would be too stale to use, whatever its max-age says.
        lifetime = min(self._lifetime(max_age), self._settings.jwks_max_stale_seconds)
        self._refresh_at = now + lifetime * REFRESH_AT
        JWKS_KEYS.set(len(keys))
        JWKS_AGE.set(0)

    async def _discover(self) -> str:
        """The ``jwks_uri`` of the issuer's discovery document (OpenID Connect Discovery 1.0, section 4), whose
        ``issuer`` must be the configured one. Raises ``KeySetError`` otherwise.
        """
        issuer = self._settings.jwt_issuer or ""
        document, _ = await self._fetch(
            issuer.rstrip("/") + "/.well-known/openid-configuration", self._settings.jwks_fetch_timeout_seconds
        )
        if not isinstance(document, dict) or document.get("issuer") != issuer:
            raise KeySetError("the discovery document names another issuer")
        url = document.get("jwks_uri")
        if not isinstance(url, str) or not is_remote_key_url(url, development=not outside_development(self._settings)):
            raise KeySetError("the discovery document's jwks_uri is missing or not https")
        self._jwks_url = url
        return url

    def _lifetime(self, max_age: float | None) -> float:
        """How long a set fetched with ``max_age`` is kept, clamped to the settings."""
        settings = self._settings
        if max_age is None:
            return settings.jwks_default_cache_seconds
        return min(max(max_age, settings.jwks_min_cache_seconds), settings.jwks_max_cache_seconds)


_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*\"?(\d+)\"?\s*(?:,|$)", re.IGNORECASE)


def max_age_of(cache_control: str | None) -> float | None:
    """The ``max-age`` of a ``Cache-Control`` value in seconds (RFC 9111 5.2.2.1), 0 for ``no-store`` or
    ``no-cache``, None when it has none."""
    if not cache_control:
        return None
    if re.search(r"(?:^|,)\s*no-(?:store|cache)\s*(?:,|$)", cache_control, re.IGNORECASE):
        return 0.0
    found = _MAX_AGE.search(cache_control)
    return float(found.group(1)) if found else None


async def fetch_json(url: str, timeout_seconds: float) -> tuple[object, float | None]:
    """GET ``url`` (no redirects, no proxy from the environment, at most ``MAX_DOCUMENT_BYTES``); the JSON
    document and its ``Cache-Control`` max-age. Raises ``aiohttp.ClientError``, ``TimeoutError`` or
    ``ValueError`` (not 200, too large, not JSON).
    """
    timeout = aiohttp.ClientTimeout(total=timeout_seconds)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(url, allow_redirects=False, headers={"Accept": "application/json"}) as response,
    ):
        if response.status != 200:
            raise ValueError(f"HTTP {response.status}")
        body = bytearray()
        async for chunk in response.content.iter_chunked(64 * 1024):
            body.extend(chunk)
            if len(body) > MAX_DOCUMENT_BYTES:
                raise ValueError("document too large")
        try:
            document = json.loads(body)
        except RecursionError:
            raise ValueError("document nested too deeply") from None
        return document, max_age_of(response.headers.get("Cache-Control"))


def key_source(settings: TokenSettings) -> StaticKeys | RemoteKeys:
    """The key source the settings name (docs/keys.md: Connect your identity provider). Raises
    ``KeySetError`` for a key file or public key that cannot be used.
    """
    if settings.jwt_jwks_url or settings.jwt_oidc_discovery:
        return RemoteKeys(settings)
    if settings.jwt_key_files:
        return StaticKeys(read_key_files(path.strip() for path in settings.jwt_key_files.split(",") if path.strip()))
    if settings.jwt_public_key:
        try:
            return StaticKeys((_pem_key(settings.jwt_public_key.encode()),))
        except ValueError as exc:
            raise KeySetError(f"CHATEXPORT_JWT_PUBLIC_KEY cannot be used: {type(exc).__name__}") from None
    return StaticKeys((secret_key(settings.jwt_secret),))
