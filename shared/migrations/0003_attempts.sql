-- The history of an operation's attempts: one row per claim (per lease generation), opened in the claim's
-- statement and closed by the statement that ends the attempt, so it never disagrees with the operation.
-- outcome, set with ended_at:
--   SUCCEEDED, RETRY_AT, FAILED, FAILED_REPAIR, CANCELED: the state the holder's last write committed;
--   HANDED_BACK: the holder let its lease go (a graceful stop, or a cancel whose objects S3 kept);
--   LEASE_LOST: the lease expired before its holder ended it, noticed by a takeover (generation + 1), by
--   the parking of a worker-lost operation, or by the janitor finishing a cancellation.
-- error_code is the code the ending wrote to the operation, if any. Operations claimed before this
-- migration have no rows for those claims.
CREATE TABLE attempts (
    operation_id text NOT NULL REFERENCES operations (operation_id) ON DELETE CASCADE,
    generation bigint NOT NULL,
    attempt integer NOT NULL,
    worker_id text NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    ended_at timestamptz,
    outcome text CHECK (outcome IN ('SUCCEEDED', 'RETRY_AT', 'FAILED', 'FAILED_REPAIR', 'CANCELED',
                                    'HANDED_BACK', 'LEASE_LOST')),
    error_code text,
    PRIMARY KEY (operation_id, generation),
    CONSTRAINT attempts_ended_with_outcome CHECK ((ended_at IS NULL) = (outcome IS NULL))
);
