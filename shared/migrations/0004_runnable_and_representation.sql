-- When an operation may be claimed to run an attempt, defined once: the worker's claim and the janitor's
-- search for stranded work both ask it. QUEUED; RETRY_AT whose time has come; RUNNING whose lease has
-- expired (a takeover). Times are the database's. STABLE (it reads now()); a SQL function this simple is
-- inlined by the planner.
CREATE FUNCTION operation_is_runnable(state text, retry_at timestamptz, lease_expires_at timestamptz)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT state = 'QUEUED'
        OR (state = 'RETRY_AT' AND retry_at <= now())
        OR (state = 'RUNNING' AND lease_expires_at < now())
$$;

-- An operation as the API represents it: every column the representation and the admin view read, and
-- its age by the database clock. finished_at is when a SUCCEEDED result was published (its download's
-- Last-Modified).
CREATE VIEW operation_representations AS
SELECT operation_id, kind, owner_id, conversation_id, format, before_seq, after_seq, state, created_at,
       updated_at, attempt, generation, progress_phase, messages_written, bytes_written, snapshot_max_seq,
       retry_at, error_code, error_message, result_key, result_size_bytes, result_sha256, result_message_count,
       result_expires_at, finished_at, lease_owner, lease_expires_at,
       extract(epoch FROM now() - created_at)::float8 AS age_seconds
FROM operations;
