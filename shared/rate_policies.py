"""The names of the limits each user is held to (docs/api.md: Rate limits), as the ``RateLimit-Policy`` and
``RateLimit`` fields, a 429's ``violated-policies``, ``GET /v3/limits``, the route table and the submit's server
function (migration 0028) write them.
"""

from __future__ import annotations

from enum import StrEnum


class PolicyName(StrEnum):
    """One policy. The first three count requests in a window; ``CONTENT_BYTES`` is a budget of stored bytes;
    the ``OPEN_*`` ones and ``ACTIVE_EXPORTS`` bound what a user holds at once.
    """

    SUBMITS = "submits"
    POLLS = "polls"
    DOWNLOADS = "downloads"
    CONTENT_BYTES = "content-bytes"
    ACTIVE_EXPORTS = "active-exports"
    OPEN_DOWNLOADS = "open-downloads"
    OPEN_WAITERS = "open-waiters"
    OPEN_UPLOADS = "open-uploads"


# The policies counted in windows of time; of those, the ones each API process counts from local shares
# (services.api.limiting.limiter), which a submit is not: it is counted in its own statement.
WINDOWED = (PolicyName.SUBMITS, PolicyName.POLLS, PolicyName.DOWNLOADS)
SHARED = (PolicyName.POLLS, PolicyName.DOWNLOADS)
