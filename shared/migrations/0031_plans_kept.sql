-- step: pre
-- The same rules for less work in Postgres on every export (docs/benchmark.md: Plans kept). A function written
-- in SQL that Postgres cannot inline into its caller is parsed and planned again at every call; the three that a
-- submit, a claim and a SUCCEEDED commit call every time are now PL/pgSQL, whose plans a session keeps. Their
-- signatures and results are unchanged, and the previous release calls open_attempt and close_attempt as before.
-- create_operation_v3, which only this release calls, reads the owner's holdings once when the storage budget
-- applies and takes the active-export count from them instead of counting again; its answers are unchanged.

CREATE OR REPLACE FUNCTION open_attempt(p_operation_id text, p_generation bigint, p_attempt integer, p_worker_id text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO attempts (operation_id, generation, attempt, worker_id)
    VALUES (p_operation_id, p_generation, p_attempt, p_worker_id);
END;
$$;

CREATE OR REPLACE FUNCTION close_attempt(p_operation_id text, p_generation bigint, p_outcome text, p_error_code text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE attempts SET ended_at = now(), outcome = p_outcome, error_code = p_error_code
    WHERE operation_id = p_operation_id AND generation = p_generation AND ended_at IS NULL;
END;
$$;

-- The bytes p_owner_id holds: results that have not expired, and what exports being written have written so far.
-- next_expiry_seconds is the time until the first of those results expires (NULL when there is none);
-- active_count the exports not yet ended.
CREATE OR REPLACE FUNCTION content_bytes_used_v1(p_owner_id text, p_active_states text[],
                                                 OUT used_bytes bigint, OUT next_expiry_seconds float8,
                                                 OUT active_count bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT coalesce(sum(CASE WHEN o.state = 'SUCCEEDED' THEN coalesce(o.result_size_bytes, 0)
                             ELSE coalesce(o.bytes_written, 0) END), 0)::bigint,
           extract(epoch FROM min(o.result_expires_at) FILTER (WHERE o.state = 'SUCCEEDED') - now())::float8,
           count(*) FILTER (WHERE o.state = ANY(p_active_states))
      INTO used_bytes, next_expiry_seconds, active_count
      FROM operations o
     WHERE o.owner_id = p_owner_id
       AND ((o.state = 'SUCCEEDED' AND o.result_expires_at > now()) OR o.state = ANY(p_active_states));
END;
$$;

CREATE OR REPLACE FUNCTION create_operation_v3(
    p_operation_id text, p_owner_id text, p_conversation_id text, p_request jsonb,
    p_max_active integer, p_active_states text[], p_routing_key text, p_payload_version integer,
    p_idempotency_key text, p_fingerprint text, p_replay_window_seconds float8,
    p_schedule_id text, p_due_at timestamptz, p_created_at timestamptz, p_traceparent text, p_answered boolean,
    p_submits_quota bigint, p_submits_window_seconds integer, p_content_bytes bigint,
    OUT outcome submit_outcome, OUT operation_id text, OUT accepted operation_representations_v2,
    OUT violated text, OUT submits_remaining bigint, OUT submits_reset_seconds float8,
    OUT content_bytes_used bigint, OUT retry_after_seconds float8)
LANGUAGE plpgsql AS $$
DECLARE
    allowance record;
    active bigint;
BEGIN
    SELECT b.outcome, b.earlier_id INTO outcome, operation_id
      FROM begin_creation_v1(p_owner_id, p_conversation_id, p_idempotency_key, p_fingerprint,
                             p_replay_window_seconds, 'operation') b;
    IF outcome IS NULL THEN
        -- The count's snapshot is taken after the lock is granted (READ COMMITTED): a submit and a run cannot
        -- both take the last slot. With a storage budget, the one read of the owner's holdings counts them too.
        IF p_content_bytes IS NOT NULL THEN
            SELECT u.used_bytes, u.next_expiry_seconds, u.active_count INTO content_bytes_used, retry_after_seconds, active
              FROM content_bytes_used_v1(p_owner_id, p_active_states) u;
        ELSE
            active := (SELECT count(*) FROM operations o
                        WHERE o.owner_id = p_owner_id AND o.state = ANY(p_active_states));
        END IF;
        IF active >= p_max_active THEN
            outcome := 'quota';
            violated := 'active-exports';
            content_bytes_used := NULL;  -- the active-export quota answers alone, as it did before it read them
            retry_after_seconds := NULL;
            RETURN;
        END IF;
        IF p_content_bytes IS NOT NULL THEN
            IF content_bytes_used >= p_content_bytes THEN
                outcome := 'quota';
                violated := 'content-bytes';
                RETURN;
            END IF;
            retry_after_seconds := NULL;
        END IF;
        IF p_submits_quota IS NOT NULL THEN
            SELECT * INTO allowance
              FROM take_allowance_v1(p_owner_id, 'submits', p_submits_quota, p_submits_window_seconds, 1);
            submits_remaining := allowance.remaining;
            submits_reset_seconds := allowance.reset_seconds;
            IF allowance.granted = 0 THEN
                outcome := 'quota';
                violated := 'submits';
                retry_after_seconds := allowance.reset_seconds;
                RETURN;
            END IF;
        END IF;
        -- jsonb_populate_record reads each member as its column's type; a static statement, so its plan is kept.
        INSERT INTO operations (operation_id, owner_id, conversation_id, state, format, before_seq, after_seq,
                                notify_url, since, until, senders, compression, max_part_bytes,
                                schedule_id, due_at, created_at, updated_at, traceparent,
                                media, media_types, media_max_file_bytes, media_max_total_bytes)
        SELECT p_operation_id, p_owner_id, p_conversation_id, 'QUEUED', r.format, r.before_seq, r.after_seq,
               r.notify_url, r.since, r.until, r.senders, r.compression, r.max_part_bytes,
               p_schedule_id, p_due_at, coalesce(p_created_at, now()), coalesce(p_created_at, now()), p_traceparent,
               r.media, r.media_types, r.media_max_file_bytes, r.media_max_total_bytes
          FROM jsonb_populate_record(NULL::operations, p_request) r
        ON CONFLICT (schedule_id, due_at) DO NOTHING;
        IF FOUND THEN
            IF p_idempotency_key IS NOT NULL THEN
                INSERT INTO idempotency_keys (owner_id, idempotency_key, fingerprint, operation_id)
                VALUES (p_owner_id, p_idempotency_key, p_fingerprint, p_operation_id);
            END IF;
            PERFORM enqueue_wake_up_v1(p_operation_id, p_routing_key, NULL, 0, p_payload_version);
            operation_id := p_operation_id;
            outcome := 'created';
        ELSE
            SELECT o.operation_id INTO operation_id FROM operations o
             WHERE o.schedule_id = p_schedule_id AND o.due_at = p_due_at;
            outcome := 'replayed';
        END IF;
    END IF;
    IF p_answered AND outcome IN ('created', 'replayed') THEN
        SELECT r.* INTO accepted FROM operation_representations_v2 r
         WHERE r.operation_id = create_operation_v3.operation_id;
    END IF;
END;
$$;
