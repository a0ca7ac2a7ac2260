"""The ``RateLimit-Policy`` and ``RateLimit`` fields of draft-ietf-httpapi-ratelimit-headers (draft -11's
syntax), serialised as Structured Fields (RFC 9651) by ``http-sfv``, and nowhere else: the draft still changes
(docs/api.md: Rate limits, The fields).

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

from services.api.limiting.policies import Policy, Standing

POLICY_FIELD = "RateLimit-Policy"
LIMIT_FIELD = "RateLimit"


def rate_limit_fields(standings: Sequence[Standing], partition_key: bytes) -> dict[str, str]:
    """The two fields for ``standings`` (one item per policy, in their order), each item with ``partition_key``."""
    limits = http_sfv.List()
    for standing in standings:
        policy = standing.policy
        current = http_sfv.Item(policy.name.value)
        current.params["r"] = max(0, standing.remaining)
        if standing.reset_seconds is not None:
            current.params["t"] = max(0, math.ceil(standing.reset_seconds))
        current.params["pk"] = partition_key
        limits.append(current)
    policies = _policy_field(tuple(standing.policy for standing in standings), partition_key)
    return {POLICY_FIELD: policies, LIMIT_FIELD: str(limits)}


# A user's policies read the same on every answer: serialised once per user and set of policies (a poll's
# cost; docs/benchmark.md).
@functools.lru_cache(maxsize=16384)
def _policy_field(policies: tuple[Policy, ...], partition_key: bytes) -> str:
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
    return str(field)
