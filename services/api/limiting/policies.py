"""The policies a user is held to, as the settings set them, and where a user stands against one
(docs/api.md: Rate limits).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import math
import random
from dataclasses import dataclass

from shared.auth import Principal
from shared.rate_policies import PolicyName
from shared.settings import ApiPartSettings

# The quota units of draft-ietf-httpapi-ratelimit-headers (its "qu" parameter); requests when unset.
CONTENT_BYTES_UNIT = "content-bytes"
CONCURRENT_UNIT = "concurrent-requests"
# The pk parameter: this many bytes of the HMAC, enough to tell users apart, too few to be worth inverting.
PARTITION_KEY_BYTES = 12


@dataclass(frozen=True)
class Policy:
    """``quota`` units per ``window_seconds`` (None: a bound on what is held at once, or a budget), in ``unit``
    (None: requests)."""

    name: PolicyName
    quota: int
    window_seconds: int | None = None
    unit: str | None = None


@dataclass(frozen=True)
class Standing:
    """Where a user stands against ``policy``: ``remaining`` units, and ``reset_seconds`` until the window
    ends (None when no window will give any back at a known time)."""

    policy: Policy
    remaining: int
    reset_seconds: float | None = None


def policies(settings: ApiPartSettings) -> dict[PolicyName, Policy]:
    """Every policy, from ``settings``."""
    return {
        policy.name: policy
        for policy in (
            Policy(PolicyName.SUBMITS, settings.rate_limit_submits, settings.rate_limit_submits_window_seconds),
            Policy(PolicyName.POLLS, settings.rate_limit_polls, settings.rate_limit_polls_window_seconds),
            Policy(PolicyName.DOWNLOADS, settings.rate_limit_downloads, settings.rate_limit_downloads_window_seconds),
            Policy(PolicyName.CONTENT_BYTES, settings.rate_limit_content_bytes, unit=CONTENT_BYTES_UNIT),
            Policy(PolicyName.ACTIVE_EXPORTS, settings.max_active_exports, unit=CONCURRENT_UNIT),
            Policy(PolicyName.OPEN_DOWNLOADS, settings.download_per_user_concurrency, unit=CONCURRENT_UNIT),
            Policy(PolicyName.OPEN_WAITERS, settings.wait_per_user_concurrency, unit=CONCURRENT_UNIT),
            Policy(PolicyName.OPEN_UPLOADS, settings.upload_per_user_concurrency, unit=CONCURRENT_UNIT),
        )
    }


def is_exempt(principal: Principal, settings: ApiPartSettings) -> bool:
    """Whether no policy counts ``principal``'s requests: an admin token, while
    ``CHATEXPORT_RATE_LIMIT_ADMIN_EXEMPT`` holds."""
    return principal.is_admin and settings.rate_limit_admin_exempt


class PartitionKeys:
    """The ``pk`` of a user's fields: the first ``PARTITION_KEY_BYTES`` of an HMAC-SHA256 of the id under
    ``CHATEXPORT_RATE_LIMIT_PARTITION_KEY`` (or a key derived from the webhook signing key), so that a field
    never shows the id and no one without the key can tell whose it is. The server key is derived once and
    the last users' keys are kept: every answer of a counted route needs one (a poll's cost;
    docs/benchmark.md)."""

    def __init__(self, settings: ApiPartSettings) -> None:
        key = settings.rate_limit_partition_key
        if key is None:
            key = hmac.new(
                settings.webhook_signing_key.encode(), b"chatexport rate-limit partition key", hashlib.sha256
            ).hexdigest()
        self._key = key.encode()
        self._kept = functools.lru_cache(maxsize=16384)(self._of)

    def __call__(self, user_id: str) -> bytes:
        """The ``pk`` of ``user_id``."""
        return self._kept(user_id)

    def _of(self, user_id: str) -> bytes:
        return hmac.new(self._key, user_id.encode(), hashlib.sha256).digest()[:PARTITION_KEY_BYTES]


def retry_after_seconds(reset_seconds: float, *, margin_seconds: float) -> int:
    """A ``Retry-After`` for a window that ends in ``reset_seconds``: never earlier than that plus
    ``margin_seconds`` (what the window's end as this process knows it may lag the database's), plus a
    jitter of up to a tenth of it (at least a second), so that refused clients do not all come back at once.
    """
    jitter = random.uniform(0.0, max(1.0, reset_seconds / 10))
    return max(1, math.ceil(reset_seconds + margin_seconds + jitter))
