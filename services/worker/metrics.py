"""The worker's Prometheus metrics (names follow Prometheus conventions: units in names, ``_total`` counters).

Shared with other parts: ``shared.metrics.CANCELLATIONS_FINISHED`` (``by="worker"``) and
``AUTHORIZATION_REFUSALS`` (``stage="execute"``).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from shared.metrics import counter_from_zero

ATTEMPT_OUTCOMES = ("SUCCEEDED", "RETRY_AT", "FAILED", "FAILED_REPAIR", "CANCELED", "HANDED_BACK", "LEASE_LOST")
FENCED_WRITES = ("heartbeat", "progress", "artifact", "assembly", "result", "state")

STALE_GENERATION_WRITES = counter_from_zero(
    "chatexport_worker_stale_generation_writes_total",
    "Writes of a lease holder rejected because a newer generation holds the operation.",
    "write",
    FENCED_WRITES,
)
ARTIFACTS_ADOPTED = Counter(
    "chatexport_worker_artifacts_adopted_total",
    "Complete, verified objects of an earlier generation published by the generation that took over.",
)
EARLIER_ARTIFACTS_REMOVED = Counter(
    "chatexport_worker_earlier_artifacts_removed_total",
    "Partial or unverifiable objects and uploads of an earlier generation removed at a takeover.",
)
UNKNOWN_WAKEUPS = Counter(
    "chatexport_worker_unknown_wakeups_total",
    "Wake-ups naming an operation that does not exist (purged, or from another deployment), acked and logged.",
)
MESSAGES_PUT_BACK = Counter(
    "chatexport_worker_messages_put_back_total",
    "Wake-ups of a payload version this worker does not read, returned to the queue for a worker that does"
    " (the queue dead-letters one returned more often than its delivery limit).",
)
LEASE_TAKEOVERS = Counter(
    "chatexport_worker_lease_takeovers_total",
    "Leases taken over from a holder whose lease had expired (its worker lost, frozen or cut off).",
)
ATTEMPTS_ENDED = counter_from_zero(
    "chatexport_worker_attempts_ended_total",
    "Export attempts this worker ended, by outcome: SUCCEEDED, RETRY_AT, FAILED, FAILED_REPAIR, CANCELED,"
    " HANDED_BACK (shutdown) or LEASE_LOST (a newer generation or a cancel took the operation).",
    "outcome",
    ATTEMPT_OUTCOMES,
)
CONSUMER_PAUSES = Counter(
    "chatexport_worker_consumer_pauses_total",
    "Times a queue's consumer was cancelled because every slot stayed busy with no work ending; it consumes"
    " again once a slot frees. By work: export or chunk.",
    ["work"],
)
EXPORTS_RUNNING = Gauge(
    "chatexport_worker_exports_running",
    "Exports this worker is running now (at most CHATEXPORT_WORKER_CONCURRENCY).",
)
EXPORTED_BYTES = Counter(
    "chatexport_worker_exported_bytes_total",
    "Bytes of export files (as stored: compressed when asked) handed to the S3 upload, counted per range.",
)
CHUNK_OUTCOMES = ("DONE", "RETRY", "FAILED", "HANDED_BACK", "LEASE_LOST")
CHUNKS_ENDED = counter_from_zero(
    "chatexport_worker_chunks_ended_total",
    "Chunk attempts this worker ended, by outcome: DONE, RETRY (a transient error; the chunk runs again after"
    " its backoff), FAILED (its budget spent), HANDED_BACK (shutdown) or LEASE_LOST (superseded or canceled).",
    "outcome",
    CHUNK_OUTCOMES,
)
CHUNK_TAKEOVERS = Counter(
    "chatexport_worker_chunk_takeovers_total",
    "Chunk leases taken over from a holder whose lease had expired.",
)
ASSEMBLY_BYTES_READ = Counter(
    "chatexport_worker_assembly_bytes_read_total",
    "Bytes of chunk objects a coordinator read to assemble a chunked export's file.",
)
ASSEMBLIES_RESUMED = Counter(
    "chatexport_worker_assemblies_resumed_total",
    "Assemblies a coordinator that took over resumed from the earlier generation's last checkpoint instead of"
    " reading every chunk again.",
)
CHUNKS_RUNNING = Gauge(
    "chatexport_worker_chunks_running",
    "Chunks this worker is writing now (at most CHATEXPORT_WORKER_CHUNK_CONCURRENCY).",
)
READ_SERVERS = ("standby", "primary", "both")
EXPORT_READS = counter_from_zero(
    "chatexport_worker_export_reads_total",
    "Export attempts and chunks that read their messages, by the server their reads went to: standby (the"
    " CHATEXPORT_DATABASE_READ_URL), primary, or both (the standby gave up part way).",
    "server",
    READ_SERVERS,
)
STANDBY_FALLBACK_REASONS = ("lag", "not_standby", "claim_not_visible", "conflict", "unavailable")
STANDBY_FALLBACKS = counter_from_zero(
    "chatexport_worker_standby_fallbacks_total",
    "Attempts and chunks whose remaining reads moved from the standby to the primary, by reason: lag (not caught"
    " up with the claim within CHATEXPORT_DATABASE_READ_WAIT_SECONDS), not_standby (the server is not in"
    " recovery: promoted, or a primary), claim_not_visible (caught up, but without the claim's row under its"
    " generation: a standby forked from another history), conflict (a read cancelled by a recovery conflict)"
    " or unavailable (the standby could not be reached or failed otherwise).",
    "reason",
    STANDBY_FALLBACK_REASONS,
)
# Read from the management API (CHATEXPORT_AMQP_MANAGEMENT_URL) by services.worker.queue.members.
BROKER_QUEUE_MEMBERS = Gauge(
    "chatexport_broker_queue_members",
    "Nodes holding a replica of each quorum queue (work, chunks, dead letters), as the RabbitMQ management API"
    " last listed them; only with CHATEXPORT_AMQP_MANAGEMENT_URL set.",
    ["queue"],
)
BROKER_QUEUE_MEMBERS_WANTED = Gauge(
    "chatexport_broker_queue_members_wanted",
    "CHATEXPORT_AMQP_QUORUM_INITIAL_GROUP_SIZE: the replicas each quorum queue should have; only when it and"
    " CHATEXPORT_AMQP_MANAGEMENT_URL are set.",
)
