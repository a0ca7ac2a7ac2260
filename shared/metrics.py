"""Prometheus metrics counted by more than one part, defined once (prometheus_client refuses a name twice
in one process, and tests import every part into one).

Each part's own metrics live in its ``metrics.py``; every part serves the default registry on its
monitoring port (``shared.monitoring``).
"""

from __future__ import annotations

from prometheus_client import Counter

CANCELLATIONS_FINISHED = Counter(
    "chatexport_cancellations_finished_total",
    "Operations moved from CANCEL_REQUESTED to CANCELED, by the part that finished them (contract 5.4).",
    ["by"],
)
REFRESH_FAILURES = Counter(
    "chatexport_metrics_refresh_failures_total",
    "Scrapes whose refresh of database-backed gauges failed or timed out; those gauges then still show the"
    " figures of the last refresh that worked.",
)
AUTHORIZATION_REFUSALS = Counter(
    "chatexport_authorization_refusals_total",
    "Requests or exports refused because the owner is not (or no longer) a member, by stage (contract 5.7).",
    ["stage"],
)

# Every labelled series exists from the start, at 0, so a rate over it is defined before the first event.
for _by in ("worker", "janitor"):
    CANCELLATIONS_FINISHED.labels(by=_by)
for _stage in ("submit", "execute", "download"):
    AUTHORIZATION_REFUSALS.labels(stage=_stage)
