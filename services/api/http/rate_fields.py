"""The ``RateLimit-Policy`` and ``RateLimit`` fields of draft-ietf-httpapi-ratelimit-headers (draft -11's
syntax), serialised as Structured Fields (RFC 9651) by ``http-sfv``, and nowhere else but for the integers an
answer writes between the pieces it serialised: the draft still changes (docs/api.md: Rate limits, The fields).

``RateLimit-Policy`` is a List of Strings, one per policy, with ``q`` (the quota), ``w`` (the window in seconds;
absent for a budget or a bound on what is held at once), ``qu`` (the quota unit, when not requests) and ``pk``
(the partition key, a Byte Sequence). ``RateLimit`` is a List of Strings with ``r`` (what remains), ``t`` (seconds
until the window gives some back; absent when no window will) and ``pk``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import http_sfv
from http_sfv.item import Parameters

from services.api.limiting.policies import Policy, Standing

POLICY_FIELD = "RateLimit-Policy"
LIMIT_FIELD = "RateLimit"


def rate_limit_fields(standings: Sequence[Standing], partition_key: bytes) -> dict[str, str]:
    """The two fields for ``standings`` (one item per policy, in their order), each item with ``partition_key``.

    Raises ``ValueError`` for a figure outside a Structured Field Integer's 15 digits.
    """
    policies, names, key = _serialised(tuple(standing.policy for standing in standings), partition_key)
    items = []
    for standing, name in zip(standings, names, strict=True):
        remaining = f"{name};r={_integer(max(0, standing.remaining))}"
        if standing.reset_seconds is not None:
            remaining += f";t={_integer(max(0, math.ceil(standing.reset_seconds)))}"
        items.append(remaining + key)
    return {POLICY_FIELD: policies, LIMIT_FIELD: ", ".join(items)}


_MAX_INTEGER = 999_999_999_999_999


def _integer(value: int) -> str:
    """A non-negative Structured Field Integer (RFC 9651, 4.1.4): its decimal digits, at most 15."""
    if value > _MAX_INTEGER:
        raise ValueError(f"{value} is over a Structured Field Integer's 15 digits")
    return str(value)


# A user's policies read the same on every answer, and so does each ``RateLimit`` item but for its integers:
# both are serialised by ``http-sfv`` once per user and set of policies, and an answer writes its integers
# between the item's name and its ``pk`` (a poll's cost; docs/benchmark.md: Rate limits).
@functools.lru_cache(maxsize=16384)
def _serialised(policies: tuple[Policy, ...], partition_key: bytes) -> tuple[str, tuple[str, ...], str]:
    """``RateLimit-Policy``; each policy's name as a ``RateLimit`` item begins; the ``pk`` parameter every item
    ends with."""
    field = http_sfv.List()
    for policy in policies:
        declared = http_sfv.Item(policy.name.value)
        declared.params["q"] = policy.quota
        if policy.window_seconds is not None:
            declared.params["w"] = policy.window_seconds
        if policy.unit is not None:
            declared.params["qu"] = policy.unit
        declared.params["pk"] = partition_key
        field.append(declared)
    key = Parameters()
    key["pk"] = partition_key
    return str(field), tuple(str(http_sfv.Item(policy.name.value)) for policy in policies), str(key)
