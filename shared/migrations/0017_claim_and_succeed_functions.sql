-- A worker's claim and its SUCCEEDED commit, one call each (docs/benchmark.md: Benchmark, Counts): the claim
-- was seven round trips (BEGIN, park, claim, supersede, open the attempt, membership, COMMIT) and the commit six,
-- each waiting on the last. Every statement they ran that was a repository function's is a function here, which
-- that repository function now calls (shared/repository/attempts.py, leases.py, artifacts.py, message_store.py),
-- so each rule is written once; claim_export and succeed_export compose them. The rules are unchanged
-- (docs/states.md: States and failure model, Attempts).

CREATE FUNCTION open_attempt(p_operation_id text, p_generation bigint, p_attempt integer, p_worker_id text)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO attempts (operation_id, generation, attempt, worker_id)
    VALUES (p_operation_id, p_generation, p_attempt, p_worker_id)
$$;

CREATE FUNCTION close_attempt(p_operation_id text, p_generation bigint, p_outcome text, p_error_code text)
RETURNS void LANGUAGE sql AS $$
    UPDATE attempts SET ended_at = now(), outcome = p_outcome, error_code = p_error_code
    WHERE operation_id = p_operation_id AND generation = p_generation AND ended_at IS NULL
$$;

-- True when it closed an attempt: the claim that moved to p_generation took the operation over.
CREATE FUNCTION supersede_attempts(p_operation_id text, p_generation bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE attempts SET ended_at = now(), outcome = 'LEASE_LOST'
    WHERE operation_id = p_operation_id AND generation < p_generation AND ended_at IS NULL;
    RETURN FOUND;
END;
$$;

-- The membership row stays share-locked until the caller's transaction ends, so a removal waits for it.
CREATE FUNCTION member_locked(p_conversation_id text, p_user_id text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM conversation_members
     WHERE conversation_id = p_conversation_id AND user_id = p_user_id FOR SHARE;
    RETURN FOUND;
END;
$$;

CREATE FUNCTION park_abandoned(p_operation_id text, p_max_attempts integer, p_message text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_generation bigint;
BEGIN
    UPDATE operations SET state = 'FAILED_REPAIR', error_code = 'WORKER_LOST', error_message = p_message,
        progress_phase = 'failed_repair', lease_owner = NULL, lease_expires_at = NULL,
        finished_at = now(), updated_at = now()
    WHERE operation_id = p_operation_id AND state = 'RUNNING' AND lease_expires_at < now()
      AND attempt >= p_max_attempts
    RETURNING generation INTO v_generation;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM close_attempt(p_operation_id, v_generation, 'LEASE_LOST', 'WORKER_LOST');
    RETURN true;
END;
$$;

-- The operation's whole row comes back, so a column added later reaches the worker with no new version of
-- this function; claimed is a row of NULLs when nothing was runnable. Callers select (claimed).*: a
-- composite value's layout is cached per connection by the driver, which fails to decode it, after the
-- statement ran, once a migration added a column; plain columns make Postgres refuse the cached plan first.
CREATE FUNCTION claim_lease(p_operation_id text, p_worker_id text, p_lease_seconds float8,
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

-- park_abandoned, else claim_lease and, when it claimed, the owner's membership, share-locked.
CREATE FUNCTION claim_export(p_operation_id text, p_worker_id text, p_lease_seconds float8,
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
    SELECT * INTO lease FROM claim_lease(p_operation_id, p_worker_id, p_lease_seconds);
    took_over := lease.took_over;
    claimed := lease.claimed;
    IF claimed.operation_id IS NOT NULL THEN
        member := member_locked(claimed.conversation_id, claimed.owner_id);
    END IF;
END;
$$;

CREATE FUNCTION succeed_lease(p_operation_id text, p_generation bigint, p_key text, p_size_bytes bigint,
                              p_sha256 text, p_message_count bigint, p_parts jsonb, p_ttl_seconds float8,
                              p_bytes_written bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE operations SET state = 'SUCCEEDED', result_key = p_key, result_size_bytes = p_size_bytes,
        result_sha256 = p_sha256, result_message_count = p_message_count, result_parts = p_parts,
        result_expires_at = now() + make_interval(secs => p_ttl_seconds),
        progress_phase = 'done', messages_written = p_message_count, bytes_written = p_bytes_written,
        lease_owner = NULL, lease_expires_at = NULL, finished_at = now(), updated_at = now()
    WHERE operation_id = p_operation_id AND generation = p_generation AND state = 'RUNNING';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM close_attempt(p_operation_id, p_generation, 'SUCCEEDED', NULL);
    RETURN true;
END;
$$;

-- The row lock this takes orders it against an artifact's removal.
CREATE FUNCTION publish_artifact(p_operation_id text, p_generation bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE artifacts SET state = 'PUBLISHED', updated_at = now()
    WHERE operation_id = p_operation_id AND generation = p_generation AND state = 'COMPLETE';
    RETURN FOUND;
END;
$$;

-- The membership re-check, succeed_lease and publish_artifact. An artifact removed meanwhile rolls the
-- SUCCEEDED write back with the block (a subtransaction), and nothing else of the caller's transaction.
CREATE FUNCTION succeed_export(p_conversation_id text, p_owner_id text, p_artifact_generation bigint,
                               p_operation_id text, p_generation bigint, p_key text, p_size_bytes bigint,
                               p_sha256 text, p_message_count bigint, p_parts jsonb, p_ttl_seconds float8,
                               p_bytes_written bigint) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT member_locked(p_conversation_id, p_owner_id) THEN
        RETURN 'not_member';
    END IF;
    BEGIN
        IF NOT succeed_lease(p_operation_id, p_generation, p_key, p_size_bytes, p_sha256, p_message_count,
                             p_parts, p_ttl_seconds, p_bytes_written) THEN
            RETURN 'lease_lost';
        END IF;
        IF NOT publish_artifact(p_operation_id, p_artifact_generation) THEN
            RAISE EXCEPTION USING ERRCODE = 'CX001';
        END IF;
    EXCEPTION WHEN SQLSTATE 'CX001' THEN
        RETURN 'artifact_gone';
    END;
    RETURN 'succeeded';
END;
$$;
