"""The ``RateLimit`` field of draft-ietf-httpapi-ratelimit-headers, as far as the client reads it (docs/api.md: Rate
limits): whether a policy is spent and when it gives requests back. The rest of it, and ``RateLimit-Policy``, change
nothing the client does, and a field that does not parse is as good as none: it is advice, never a refusal.
"""

from __future__ import annotations

import http_sfv


def renewal_seconds(value: str) -> int | None:
    """Seconds until every policy that the ``RateLimit`` field ``value`` shows spent (``r=0``) gives requests back:
    the largest of their ``t`` (Integers, in seconds). None when no policy is spent with a ``t``, or when ``value``
    is empty or not a Structured Fields List (docs/api.md: Rate limits).
    """
    field = http_sfv.List()
    try:
        field.parse(value.encode())
    except ValueError:
        return None
    renewals = []
    for member in field:
        remaining, renewal = member.params.get("r"), member.params.get("t")
        # Python's bool is an int: ``?0`` is a Boolean, not the Integer 0, and not a count.
        if type(remaining) is int and remaining == 0 and type(renewal) is int and renewal >= 0:
            renewals.append(renewal)
    return max(renewals, default=None)
