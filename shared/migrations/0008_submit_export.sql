-- The submit's transaction as one server-side function (README: API reference, Submit; Benchmark): the
-- membership check, the per-user lock, the idempotency lookup, the quota and the three inserts used to be
-- ten round trips between the API and Postgres, which bounded the submits a process could answer. The
-- rules are the same, in the same order; each statement of a PL/pgSQL function takes a new snapshot under
-- READ COMMITTED, so the lookup and the count see everything committed before the lock was granted, as
-- they did when they were statements of their own. The outcome is one of 'not_member', 'reused',
-- 'expired', 'quota', 'replayed', 'created', with the operation's id when there is one.
CREATE FUNCTION submit_export(
    p_operation_id text, p_owner_id text, p_conversation_id text, p_idempotency_key text, p_fingerprint text,
    p_replay_window_seconds float8, p_max_active integer, p_active_states text[], p_routing_key text,
    p_format text, p_before_seq bigint, p_after_seq bigint, p_notify_url text, p_since timestamptz,
    p_until timestamptz, p_senders text[], p_compression text, p_max_part_bytes bigint,
    OUT outcome text, OUT operation_id text)
LANGUAGE plpgsql AS $$
DECLARE
    earlier record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conversation_members m
                   WHERE m.conversation_id = p_conversation_id AND m.user_id = p_owner_id) THEN
        outcome := 'not_member';
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('submit:' || p_owner_id, 0));
    SELECT k.fingerprint, k.operation_id,
           k.created_at + make_interval(secs => p_replay_window_seconds) <= now() AS expired
      INTO earlier FROM idempotency_keys k
     WHERE k.owner_id = p_owner_id AND k.idempotency_key = p_idempotency_key;
    IF FOUND THEN
        operation_id := earlier.operation_id;
        outcome := CASE WHEN earlier.fingerprint <> p_fingerprint THEN 'reused'
                        WHEN earlier.expired THEN 'expired' ELSE 'replayed' END;
        RETURN;
    END IF;
    IF (SELECT count(*) FROM operations o WHERE o.owner_id = p_owner_id AND o.state = ANY(p_active_states))
       >= p_max_active THEN
        outcome := 'quota';
        RETURN;
    END IF;
    INSERT INTO operations (operation_id, owner_id, conversation_id, format, before_seq, after_seq, state,
                            notify_url, since, until, senders, compression, max_part_bytes)
    VALUES (p_operation_id, p_owner_id, p_conversation_id, p_format, p_before_seq, p_after_seq, 'QUEUED',
            p_notify_url, p_since, p_until, p_senders, p_compression, p_max_part_bytes);
    INSERT INTO idempotency_keys (owner_id, idempotency_key, fingerprint, operation_id)
    VALUES (p_owner_id, p_idempotency_key, p_fingerprint, p_operation_id);
    INSERT INTO outbox (operation_id, routing_key, payload)
    VALUES (p_operation_id, p_routing_key, jsonb_build_object('operation_id', p_operation_id));
    operation_id := p_operation_id;
    outcome := 'created';
END;
$$;
