"""Signing completion callbacks as Standard Webhooks does (https://www.standardwebhooks.com/): the headers
``webhook-id``, ``webhook-timestamp`` (Unix seconds) and ``webhook-signature`` (``v1,<base64 HMAC-SHA256 of
"{id}.{timestamp}.{body}">``, several separated by spaces while a key is being rotated).

Each user has a secret of their own, derived from the deployment's key (HMAC-SHA256 of the user id), so no
user can sign, and so forge, another user's callbacks; only its owner can read it (docs/api.md:
Completion callbacks).
"""

from __future__ import annotations

import base64
import hashlib
import hmac

SECRET_PREFIX = "whsec_"


def user_secret(deployment_key: bytes, user_id: str) -> bytes:
    """The 32-byte signing secret of ``user_id`` under ``deployment_key``."""
    return hmac.new(deployment_key, b"chatexport webhook secret\x00" + user_id.encode(), hashlib.sha256).digest()


def secret_text(secret: bytes) -> str:
    """The secret as users paste it into their verifier: ``whsec_`` and its base64."""
    return SECRET_PREFIX + base64.b64encode(secret).decode()


def signature(secret: bytes, *, webhook_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,`` signature of ``body`` sent as ``webhook_id`` at ``timestamp`` (Unix seconds)."""
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(secret, signed, hashlib.sha256).digest()).decode()


def signature_header(secrets: list[bytes], *, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one signature per secret (the current key's first, then the
    previous key's while it is kept for rotation), separated by spaces.
    """
    return " ".join(signature(secret, webhook_id=webhook_id, timestamp=timestamp, body=body) for secret in secrets)
