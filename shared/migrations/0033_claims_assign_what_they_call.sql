-- step: pre
-- The claim's functions take what the functions they call return by assignment, and decide what to call with
-- IF (docs/benchmark.md: The claim's calls assigned), with the same results and versions as migration 0032.
--
-- A call read with SELECT ... INTO runs as a query of its own, with an executor's start and end around it; one
-- assigned with := is an expression PL/pgSQL evaluates at once. And 0032's `FOUND AND park_abandoned(...)` and
-- `claimed.generation > 1 AND supersede_attempts(...)` skipped their calls only because Postgres happens to
-- evaluate the left side of an AND first, which it does not promise: an IF makes the saving certain.
--
-- The previous release calls none of these functions.

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
    -- The first generation has no older attempt to supersede.
    took_over := false;
    IF claimed.generation > 1 THEN
        took_over := supersede_attempts(p_operation_id, claimed.generation);
    END IF;
    PERFORM open_attempt(p_operation_id, claimed.generation, claimed.attempt, p_worker_id);
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
    parked := false;
    IF FOUND THEN
        parked := park_abandoned(p_operation_id, p_max_attempts, p_lost_message);
        IF parked THEN
            RETURN;
        END IF;
    END IF;
    lease := claim_lease_v2(p_operation_id, p_worker_id, p_lease_seconds);
    took_over := lease.took_over;
    claimed := lease.claimed;
    IF claimed.operation_id IS NOT NULL THEN
        member := member_locked(claimed.conversation_id, claimed.owner_id);
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION claim_export_v3(p_operation_id text, p_worker_id text, p_lease_seconds float8,
                                           p_max_attempts integer, p_lost_message text, p_key_stem text,
                                           p_suffixes jsonb,
                                           OUT parked boolean, OUT took_over boolean, OUT member boolean,
                                           OUT claimed operations, OUT artifact_key text)
LANGUAGE plpgsql AS $$
DECLARE
    claim record;
BEGIN
    claim := claim_export_v2(p_operation_id, p_worker_id, p_lease_seconds, p_max_attempts, p_lost_message);
    parked := claim.parked;
    took_over := claim.took_over;
    member := claim.member;
    claimed := claim.claimed;
    IF claimed.operation_id IS NOT NULL THEN
        artifact_key := p_key_stem || claimed.generation || CASE
            WHEN claimed.max_part_bytes IS NOT NULL THEN '/'
            ELSE p_suffixes ->> concat_ws('/', claimed.format, claimed.compression,
                                          coalesce(claimed.media, false)::int)
        END;
        INSERT INTO artifacts (operation_id, generation, object_key, state)
        VALUES (p_operation_id, claimed.generation, artifact_key, 'WRITING');
    END IF;
END;
$$;
