"""The worker's Prometheus metrics (names follow Prometheus conventions: ``_total`` counters)."""

from __future__ import annotations

from prometheus_client import Counter

STALE_GENERATION_WRITES = Counter(
    "chatexport_worker_stale_generation_writes_total",
    "Writes of a lease holder rejected because a newer generation holds the operation (contract 5.3).",
    ["write"],
)
ARTIFACTS_ADOPTED = Counter(
    "chatexport_worker_artifacts_adopted_total",
    "Complete, verified objects of an earlier generation published by the generation that took over.",
)
EARLIER_ARTIFACTS_REMOVED = Counter(
    "chatexport_worker_earlier_artifacts_removed_total",
    "Partial or unverifiable objects and uploads of an earlier generation removed at a takeover.",
)
