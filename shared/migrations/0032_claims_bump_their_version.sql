-- step: pre
-- Less work in Postgres for every claim and SUCCEEDED commit (docs/benchmark.md: The claim's own steps), with
-- the same results and the same versions.
--
-- operation_versioned (migrations 0005, 0015, 0023, 0025 and 0027) compares every shown column of the row
-- before and after each update, and the claim and the SUCCEEDED commit, which change the state every time,
-- paid for that comparison and the trigger's call on every export. They now raise the version themselves
-- (and the claim fixes the snapshot's edit version at the first claim, as the trigger does), and the trigger
-- fires only for an update that left the version alone: every other writer, the previous release's included,
-- is versioned as before.
--
-- claim_lease_v2 (migration 0026) looks for older attempts to supersede only past the first generation, which
-- has none. claim_export_v2 (migration 0026) looks at the operation before it tries to park it, so the park's
-- update and the call of park_abandoned run only for an expired lease whose attempts are spent.
--
-- The previous release calls succeed_lease through succeed_export (migration 0017): its commit now raises the
-- version in its own statement, once, as the trigger did. It calls neither claim_lease_v2 nor claim_export_v2.

CREATE OR REPLACE TRIGGER operation_versioned BEFORE UPDATE ON operations
    FOR EACH ROW WHEN (NEW.version = OLD.version) EXECUTE FUNCTION operation_versioned();

CREATE OR REPLACE FUNCTION claim_lease_v2(p_operation_id text, p_worker_id text, p_lease_seconds float8,
                                          OUT took_over boolean, OUT claimed operations)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE operations o SET
        state = 'RUNNING', generation = o.generation + 1, attempt = o.attempt + 1,
        lease_owner = p_worker_id, lease_expires_at = now() + make_interval(secs => p_lease_seconds),
        snapshot_max_seq = coalesce(o.snapshot_max_seq, greatest(o.after_seq, least(
            (SELECT c.last_seq FROM conversations c WHERE c.conversation_id = o.conversation_id),
            o.before_seq - 1))),
        snapshot_edit_version = CASE WHEN o.snapshot_max_seq IS NULL
            THEN (SELECT c.last_edit_version FROM conversations c WHERE c.conversation_id = o.conversation_id)
            ELSE o.snapshot_edit_version END,
        progress_phase = 'starting', messages_written = 0, bytes_written = 0,
        retry_at = NULL, error_code = NULL, error_message = NULL, updated_at = now(), version = o.version + 1
    WHERE o.operation_id = p_operation_id AND operation_is_runnable(o.state, o.retry_at, o.lease_expires_at)
    RETURNING o.* INTO claimed;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    took_over := claimed.generation > 1 AND supersede_attempts(p_operation_id, claimed.generation);
    PERFORM open_attempt(p_operation_id, claimed.generation, claimed.attempt, p_worker_id);
END;
$$;

CREATE OR REPLACE FUNCTION succeed_lease(p_operation_id text, p_generation bigint, p_key text, p_size_bytes bigint,
                                         p_sha256 text, p_message_count bigint, p_parts jsonb,
                                         p_ttl_seconds float8, p_bytes_written bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE operations SET state = 'SUCCEEDED', result_key = p_key, result_size_bytes = p_size_bytes,
        result_sha256 = p_sha256, result_message_count = p_message_count, result_parts = p_parts,
        result_expires_at = now() + make_interval(secs => p_ttl_seconds),
        progress_phase = 'done', messages_written = p_message_count, bytes_written = p_bytes_written,
        lease_owner = NULL, lease_expires_at = NULL, finished_at = now(), updated_at = now(),
        version = version + 1
    WHERE operation_id = p_operation_id AND generation = p_generation AND state = 'RUNNING';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM close_attempt(p_operation_id, p_generation, 'SUCCEEDED', NULL);
    RETURN true;
END;
$$;

CREATE OR REPLACE FUNCTION claim_export_v2(p_operation_id text, p_worker_id text, p_lease_seconds float8,
                                           p_max_attempts integer, p_lost_message text,
                                           OUT parked boolean, OUT took_over boolean, OUT member boolean,
                                           OUT claimed operations)
LANGUAGE plpgsql AS $$
DECLARE
    lease record;
BEGIN
    -- park_abandoned's own update re-checks all of this under the row's lock.
    PERFORM FROM operations o
     WHERE o.operation_id = p_operation_id AND o.state = 'RUNNING' AND o.lease_expires_at < now()
       AND o.attempt >= p_max_attempts;
    parked := FOUND AND park_abandoned(p_operation_id, p_max_attempts, p_lost_message);
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
