"""Payload versions of what one part hands another: outbox rows, broker messages and callback bodies
(docs/deploy.md: Upgrading, Payload versions).

Version 1 is the payload release 0.1.0 writes, which carries no version: ``{"operation_id": ...}`` (a
chunk's with ``"chunk"``). This release writes version 1 too, and says so: the outbox row's
``payload_version`` column, the broker message's ``PAYLOAD_VERSION_HEADER`` header, the callback body's
``payload_version`` field. A part reads the previous release's version and its own (``READABLE``); anything
else is put back for a part that reads it, and dead-lettered after the delivery limit, never dropped and
never misread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PAYLOAD_VERSION = 1
PAYLOAD_VERSION_HEADER = "payload-version"
PAYLOAD_VERSION_FIELD = "payload_version"
# What a payload without a version is: one written by 0.1.0.
UNVERSIONED = 1
# The previous release's version (0.1.0 wrote version 1 without saying so) and this one's.
READABLE = frozenset({UNVERSIONED, PAYLOAD_VERSION})


def message_version(headers: Mapping[str, Any] | None) -> int | None:
    """The payload version of a broker message with ``headers``: ``UNVERSIONED`` when it has none (a relay
    of 0.1.0 published it), None when the header is not an integer.
    """
    value = (headers or {}).get(PAYLOAD_VERSION_HEADER, UNVERSIONED)
    return value if type(value) is int else None


def readable(version: int | None) -> bool:
    """Whether this release reads payloads of ``version``."""
    return version in READABLE
