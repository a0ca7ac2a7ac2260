"""The API's Prometheus metrics (names follow Prometheus conventions: units in names, ``_total`` counters).

Shared with other parts: ``shared.metrics.AUTHORIZATION_REFUSALS`` (stages submit, schedule and download).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from prometheus_client import Counter, Gauge, Histogram

from shared.metrics import counter_from_zero
from shared.rate_policies import SHARED, WINDOWED, PolicyName

HTTP_REQUESTS = Counter(
    "chatexport_http_requests_total",
    "HTTP requests answered, by method, route template and status.",
    ["method", "route", "status"],
)
HTTP_REQUEST_DURATION = Histogram(
    "chatexport_http_request_duration_seconds",
    "Time from a request's arrival to the end of its response (a download's whole stream), in seconds.",
    ["method", "route", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
# (method, route, status) -> that label set's counter and histogram: ``labels()`` validates and locks on every
# call, a third of the middleware's own time under polls (docs/benchmark.md: The poll's own work). The callers
# bound the label set, so the dict is bounded with it.
_request_series: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def count_request(method: str, route: str, status: int, seconds: float) -> None:
    """Count one answered request in ``HTTP_REQUESTS`` and its time (seconds) in ``HTTP_REQUEST_DURATION``,
    under the labels ``method``, ``route`` (a route template) and ``status``; the caller keeps each to a
    bounded set.
    """
    labels = (method, route, status)
    series = _request_series.get(labels)
    if series is None:
        named = (method, route, str(status))
        series = _request_series[labels] = (HTTP_REQUESTS.labels(*named), HTTP_REQUEST_DURATION.labels(*named))
    series[0].inc()
    series[1].observe(seconds)


IDEMPOTENCY_REPLAYS = Counter(
    "chatexport_idempotency_replays_total",
    "Export submissions and schedule creations answered with what an earlier request with the same key created.",
)
IDEMPOTENCY_CONFLICTS = counter_from_zero(
    "chatexport_idempotency_conflicts_total",
    "Export submissions and schedule creations refused because their Idempotency-Key was used for another"
    " request, by code.",
    "code",
    ("IDEMPOTENCY_KEY_REUSED", "IDEMPOTENCY_KEY_EXPIRED"),
)
DOWNLOADS = Counter(
    "chatexport_downloads_total",
    "Download attempts by outcome (the access event's outcome: GRANTED, EXPIRED, ACCESS_REVOKED, ...).",
    ["outcome"],
)

# The requests that wait for an operation to change (docs/api.md: Operations, Waiting for a change).
WaitKind = Literal["long_poll", "event_stream"]
WAITING_REQUESTS = Gauge(
    "chatexport_api_waiting_requests",
    "Long polls and event streams open in this process now, by kind (long_poll, event_stream).",
    ["kind"],
)
for _kind in get_args(WaitKind):
    WAITING_REQUESTS.labels(_kind)
DOWNLOADS_STREAMING = Gauge(
    "chatexport_api_downloads_streaming",
    "Downloads this process streams now, each holding a download slot.",
)
CAP_REFUSALS = Counter(
    "chatexport_api_cap_refusals_total",
    "Requests refused because a cap on long-held connections was reached, by the setting whose cap it is"
    " (wait_per_user_concurrency, download_concurrency, ...).",
    ["cap"],
)
HEAD_TIMEOUTS = Counter(
    "chatexport_api_request_head_timeouts_total",
    "Connections closed because a request line and its header fields did not arrive in full within"
    " request_header_timeout_seconds of the request's first byte.",
)
RATE_LIMIT_REFUSALS = counter_from_zero(
    "chatexport_rate_limit_refusals_total",
    "Requests refused with 429 because a user's policy was spent, by policy (docs/api.md: Rate limits).",
    "policy",
    [name.value for name in (*WINDOWED, PolicyName.CONTENT_BYTES)],
)
RATE_LIMIT_STORE_FAILURES = counter_from_zero(
    "chatexport_rate_limit_store_failures_total",
    "Takes from a user's allowance that failed or outlasted CHATEXPORT_RATE_LIMIT_TIMEOUT_SECONDS, by policy;"
    " each was let through or refused as CHATEXPORT_RATE_LIMIT_ON_STORE_FAILURE says.",
    "policy",
    [name.value for name in SHARED],
)
