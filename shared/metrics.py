"""Prometheus metrics counted by more than one part, defined once (prometheus_client refuses a name twice
in one process, and tests import every part into one).

Each part's own metrics live in its ``metrics.py``; every part serves the default registry on its
monitoring port (``shared.monitoring``).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter


def counter_from_zero(name: str, documentation: str, label: str, values: Iterable[str]) -> Counter:
    """A counter with one ``label`` whose series for each of ``values`` exist from the start, at 0, so that a
    rate over them is defined before their first event.
    """
    counter = Counter(name, documentation, [label])
    for value in values:
        counter.labels(value)
    return counter


CANCELLATIONS_FINISHED = counter_from_zero(
    "chatexport_cancellations_finished_total",
    "Operations moved from CANCEL_REQUESTED to CANCELED, by the part that finished them.",
    "by",
    ("worker", "janitor"),
)
REFRESH_FAILURES = Counter(
    "chatexport_metrics_refresh_failures_total",
    "Scrapes whose refresh of database-backed gauges failed or timed out; those gauges then still show the"
    " figures of the last refresh that worked.",
)
AUTHORIZATION_REFUSALS = counter_from_zero(
    "chatexport_authorization_refusals_total",
    "Requests or exports refused because the owner is not (or no longer) a member, by stage.",
    "stage",
    ("submit", "schedule", "execute", "download"),
)
