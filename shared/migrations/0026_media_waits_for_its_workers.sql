-- step: pre
-- An export with media waits for a worker that writes ZIPs (docs/deploy.md: Rolling deploys): the previous
-- release claims through claim_export and claim_lease (migration 0017), which now pass over an operation with
-- media, so that no worker of that release writes it as a plain file that would be served as a ZIP; its
-- wake-up is acked and the janitor wakes it again for a worker of this release. This release claims through
-- claim_export_v2 and claim_lease_v2, the functions as they were.

CREATE OR REPLACE FUNCTION claim_lease(p_operation_id text, p_worker_id text, p_lease_seconds float8,
                            OUT took_over boolean, OUT claimed operations)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE operations o SET
        state = 'RUNNING', generation = o.generation + 1, attempt = o.attempt + 1,
        lease_owner = p_worker_id, lease_expires_at = now() + make_interval(secs => p_lease_seconds),
        snapshot_max_seq = coalesce(o.snapshot_max_seq, greatest(o.after_seq, least(
            (SELECT c.last_seq FROM conversations c WHERE c.conversation_id = o.conversation_id),
            o.before_seq - 1))),
        progress_phase = 'starting', messages_written = 0, bytes_written = 0,
        retry_at = NULL, error_code = NULL, error_message = NULL, updated_at = now()
    WHERE o.operation_id = p_operation_id AND operation_is_runnable(o.state, o.retry_at, o.lease_expires_at)
      AND o.media IS NOT TRUE
    RETURNING o.* INTO claimed;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    took_over := supersede_attempts(p_operation_id, claimed.generation);
    PERFORM open_attempt(p_operation_id, claimed.generation, claimed.attempt, p_worker_id);
END;
$$;

CREATE FUNCTION claim_lease_v2(p_operation_id text, p_worker_id text, p_lease_seconds float8,
                            OUT took_over boolean, OUT claimed operations)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE operations o SET
        state = 'RUNNING', generation = o.generation + 1, attempt = o.attempt + 1,
        lease_owner = p_worker_id, lease_expires_at = now() + make_interval(secs => p_lease_seconds),
        snapshot_max_seq = coalesce(o.snapshot_max_seq, greatest(o.after_seq, least(
            (SELECT c.last_seq FROM conversations c WHERE c.conversation_id = o.conversation_id),
            o.before_seq - 1))),
        progress_phase = 'starting', messages_written = 0, bytes_written = 0,
        retry_at = NULL, error_code = NULL, error_message = NULL, updated_at = now()
    WHERE o.operation_id = p_operation_id AND operation_is_runnable(o.state, o.retry_at, o.lease_expires_at)
    RETURNING o.* INTO claimed;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    took_over := supersede_attempts(p_operation_id, claimed.generation);
    PERFORM open_attempt(p_operation_id, claimed.generation, claimed.attempt, p_worker_id);
END;
$$;

CREATE FUNCTION claim_export_v2(p_operation_id text, p_worker_id text, p_lease_seconds float8,
                             p_max_attempts integer, p_lost_message text,
                             OUT parked boolean, OUT took_over boolean, OUT member boolean,
                             OUT claimed operations)
LANGUAGE plpgsql AS $$
DECLARE
    lease record;
BEGIN
    parked := park_abandoned(p_operation_id, p_max_attempts, p_lost_message);
    IF parked THEN
        RETURN;
    END IF;
    SELECT * INTO lease FROM claim_lease_v2(p_operation_id, p_worker_id, p_lease_seconds);
    took_over := lease.took_over;
    claimed := lease.claimed;
    IF claimed.operation_id IS NOT NULL THEN
        member := member_locked(claimed.conversation_id, claimed.owner_id);
    END IF;
END;
$$;
