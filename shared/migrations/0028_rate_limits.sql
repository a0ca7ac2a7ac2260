-- step: pre
-- Each user's rate limits (docs/api.md: Rate limits). A policy's window is one row per user and policy, moved on
-- in place when a new window begins, so the table holds at most a row per user and policy. Windows are fixed
-- and aligned on the database's clock (epoch seconds divided by the window), so every API process, whatever
-- its own clock says, counts in the same window. take_allowance_v1 is the one statement that takes from one:
-- a submit takes one inside create_operation_v3, a poll or a download a batch for its process's local share.
--
-- create_operation_v3 is create_operation_v2 (migration 0025) with the storage budget and the submits policy
-- checked after the active-export quota, under the owner's lock: it says which policy refused (violated) and,
-- for the submits policy, what remains of the window. The previous release calls create_operation_v2, which
-- stays and counts nothing: an API of that release in a mixed fleet lets its submits through uncounted.

CREATE TABLE rate_limit_windows (
    user_id text NOT NULL,
    policy text NOT NULL,
    window_start timestamptz NOT NULL,
    -- The window's own length: processes configured with another one count into it until it ends.
    window_seconds integer NOT NULL,
    used bigint NOT NULL,
    PRIMARY KEY (user_id, policy)
);

-- Take up to p_wanted units from p_user_id's window of p_policy (p_quota units per p_window_seconds): granted
-- is what was taken (0 when the window is spent), remaining what is left after it, reset_seconds the time to
-- the window's end. The clock is read once the row is locked, and a window never moves back: a take that
-- waited for the lock across a window's end counts in the window the row holds. A row's window, whatever its
-- length, is counted into until it ends. p_wanted 0 only reads, without a lock.
CREATE FUNCTION take_allowance_v1(
    p_user_id text, p_policy text, p_quota bigint, p_window_seconds integer, p_wanted bigint,
    OUT granted bigint, OUT remaining bigint, OUT reset_seconds float8)
LANGUAGE plpgsql AS $$
DECLARE
    w rate_limit_windows;
    v_now timestamptz;
    v_start timestamptz;
BEGIN
    IF p_wanted > 0 THEN
        INSERT INTO rate_limit_windows (user_id, policy, window_start, window_seconds, used)
        VALUES (p_user_id, p_policy, '-infinity', p_window_seconds, 0)
        ON CONFLICT (user_id, policy) DO NOTHING;
        SELECT * INTO w FROM rate_limit_windows r
         WHERE r.user_id = p_user_id AND r.policy = p_policy FOR UPDATE;
    ELSE
        SELECT * INTO w FROM rate_limit_windows r WHERE r.user_id = p_user_id AND r.policy = p_policy;
    END IF;
    v_now := clock_timestamp();
    v_start := to_timestamp(floor(extract(epoch FROM v_now) / p_window_seconds) * p_window_seconds);
    IF w.user_id IS NULL OR NOT (w.window_start >= v_start
                                 OR w.window_start + make_interval(secs => w.window_seconds) > v_now) THEN
        w.window_start := v_start;
        w.window_seconds := p_window_seconds;
        w.used := 0;
    END IF;
    granted := greatest(0, least(p_wanted, p_quota - w.used));
    IF p_wanted > 0 THEN
        UPDATE rate_limit_windows r
           SET window_start = w.window_start, window_seconds = w.window_seconds, used = w.used + granted
         WHERE r.user_id = p_user_id AND r.policy = p_policy;
    END IF;
    remaining := greatest(0, p_quota - w.used - granted);
    reset_seconds := extract(epoch FROM w.window_start + make_interval(secs => w.window_seconds) - v_now);
END;
$$;

-- The bytes p_owner_id holds: results that have not expired, and what exports being written have written so far.
-- next_expiry_seconds is the time until the first of those results expires (NULL when there is none);
-- active_count the exports not yet ended.
CREATE FUNCTION content_bytes_used_v1(p_owner_id text, p_active_states text[],
                                      OUT used_bytes bigint, OUT next_expiry_seconds float8, OUT active_count bigint)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(CASE WHEN o.state = 'SUCCEEDED' THEN coalesce(o.result_size_bytes, 0)
                             ELSE coalesce(o.bytes_written, 0) END), 0)::bigint,
           extract(epoch FROM min(o.result_expires_at) FILTER (WHERE o.state = 'SUCCEEDED') - now())::float8,
           count(*) FILTER (WHERE o.state = ANY(p_active_states))
      FROM operations o
     WHERE o.owner_id = p_owner_id
       AND ((o.state = 'SUCCEEDED' AND o.result_expires_at > now()) OR o.state = ANY(p_active_states))
$$;

CREATE FUNCTION create_operation_v3(
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
BEGIN
    SELECT b.outcome, b.earlier_id INTO outcome, operation_id
      FROM begin_creation_v1(p_owner_id, p_conversation_id, p_idempotency_key, p_fingerprint,
                             p_replay_window_seconds, 'operation') b;
    IF outcome IS NULL THEN
        -- The count's snapshot is taken after the lock is granted (READ COMMITTED): a submit and a run cannot
        -- both take the last slot.
        IF (SELECT count(*) FROM operations o WHERE o.owner_id = p_owner_id AND o.state = ANY(p_active_states))
           >= p_max_active THEN
            outcome := 'quota';
            violated := 'active-exports';
            RETURN;
        END IF;
        IF p_content_bytes IS NOT NULL THEN
            SELECT u.used_bytes, u.next_expiry_seconds INTO content_bytes_used, retry_after_seconds
              FROM content_bytes_used_v1(p_owner_id, p_active_states) u;
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
