"""The relay's Prometheus metrics (names follow Prometheus conventions: units in names, ``_total`` counters).

The outbox backlog and its oldest row's age are system figures, served by the janitor.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from shared.metrics import counter_from_zero

PUBLISH_FAILURE_REASONS = ("timeout", "returned", "broker")

PUBLISHED = Counter(
    "chatexport_relay_published_total",
    "Outbox rows the broker confirmed and the relay marked published.",
)
PUBLISH_FAILURES = counter_from_zero(
    "chatexport_relay_publish_failures_total",
    "Publishes not confirmed, by reason: timeout (no confirm in time), returned (unroutable or refused by"
    " the broker) or broker (connection or channel error); the row is retried.",
    "reason",
    PUBLISH_FAILURE_REASONS,
)
OUTBOX_PUT_BACK = Counter(
    "chatexport_relay_outbox_put_back_total",
    "Outbox rows of a payload version this relay does not read, left for a relay that does.",
)
OUTBOX_DEAD_LETTERED = Counter(
    "chatexport_relay_outbox_dead_lettered_total",
    "Outbox rows put back up to the delivery limit and then dead-lettered (kept, never published).",
)
BATCH_DURATION = Histogram(
    "chatexport_relay_batch_duration_seconds",
    "Time to claim, publish and mark one batch of outbox rows, in seconds.",
)

WEBHOOK_OUTCOMES = ("delivered", "retried", "gave_up")
WEBHOOK_DELIVERIES = counter_from_zero(
    "chatexport_webhook_deliveries_total",
    "Completion callback attempts by outcome: delivered (a 2xx answer), retried (any other answer, a refused"
    " address or a network error, with another attempt scheduled) or gave_up (the retry time is spent).",
    "outcome",
    WEBHOOK_OUTCOMES,
)
WEBHOOK_OLDEST_UNDELIVERED_AGE = Gauge(
    "chatexport_webhook_oldest_undelivered_age_seconds",
    "Seconds since the oldest completion callback still waiting was written; 0 when none waits.",
)
