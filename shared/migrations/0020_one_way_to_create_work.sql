-- step: pre
-- One way to create work (docs/architecture.md: One way to create work). A submit and a schedule's run create
-- their operation through create_operation_v1: the membership check, the owner's lock (migration 0009) and
-- the Idempotency-Key when there is one (begin_creation_v1), the quota of active exports, the operation, and
-- the outbox row that wakes a worker. That row is written by enqueue_wake_up_v1, which every other wake-up
-- uses too, so the payload is built in one place. A schedule's creation makes the same checks through
-- begin_creation_v1. Rolling deploys: the previous release calls submit_export_v2,
-- submit_export_answered and create_export_schedule, which stay (and keep writing payload version 1).

-- PL/pgSQL, not SQL: a session keeps the INSERT's plan, where an SQL function that cannot be inlined plans it
-- again on every call (every submit calls this one).
CREATE FUNCTION enqueue_wake_up_v1(
    p_operation_id text, p_routing_key text, p_chunk_no integer, p_delay_seconds float8, p_payload_version integer)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox (operation_id, routing_key, payload, not_before, payload_version)
    VALUES (p_operation_id, p_routing_key,
            jsonb_build_object('operation_id', p_operation_id)
                || CASE WHEN p_chunk_no IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('chunk', p_chunk_no) END,
            now() + make_interval(secs => p_delay_seconds), p_payload_version);
END;
$$;

-- The checks before anything is created, in this order: the owner is a member of the conversation (else
-- 'not_member'), the owner's lock (migration 0009: a submit and a run never both take the last slot of the
-- quota), and, when p_idempotency_key is given, what an earlier use of it decides: 'replayed' (the same
-- request within the window), 'expired' (past it) or 'reused' (another request, or a key that created the
-- other kind of thing), with what the earlier use created (p_creates: 'operation' or 'schedule'). outcome is
-- NULL when creation may go on.
CREATE FUNCTION begin_creation_v1(
    p_owner_id text, p_conversation_id text, p_idempotency_key text, p_fingerprint text,
    p_replay_window_seconds float8, p_creates text, OUT outcome submit_outcome, OUT earlier_id text)
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
    IF p_idempotency_key IS NULL THEN
        RETURN;
    END IF;
    SELECT k.fingerprint,
           CASE p_creates WHEN 'operation' THEN k.operation_id ELSE k.schedule_id END AS created_id,
           k.created_at + make_interval(secs => p_replay_window_seconds) <= now() AS expired
      INTO earlier FROM idempotency_keys k
     WHERE k.owner_id = p_owner_id AND k.idempotency_key = p_idempotency_key;
    IF FOUND THEN
        earlier_id := earlier.created_id;
        outcome := CASE WHEN earlier.fingerprint <> p_fingerprint OR earlier.created_id IS NULL THEN 'reused'
                        WHEN earlier.expired THEN 'expired' ELSE 'replayed' END;
    END IF;
END;
$$;

-- A submit passes its key (p_idempotency_key and the rest) and no schedule, and p_answered: the accepted
-- operation (created or replayed) comes back as the status monitor shows it, read after the writes, so that
-- the 202 needs no second round trip (as submit_export_answered, migration 0018, did). A schedule's run passes
-- no key, its schedule and due time (the run's own key: a second run for one due time is 'replayed', with the
-- first one's id) and the time it was created. The OUT row has the view's type: a migration that drops the
-- view must drop and create this function again.
CREATE FUNCTION create_operation_v1(
    p_operation_id text, p_owner_id text, p_conversation_id text, p_request jsonb,
    p_max_active integer, p_active_states text[], p_routing_key text, p_payload_version integer,
    p_idempotency_key text, p_fingerprint text, p_replay_window_seconds float8,
    p_schedule_id text, p_due_at timestamptz, p_created_at timestamptz, p_traceparent text, p_answered boolean,
    OUT outcome submit_outcome, OUT operation_id text, OUT accepted operation_representations)
LANGUAGE plpgsql AS $$
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
            RETURN;
        END IF;
        -- jsonb_populate_record reads each member as its column's type; a static statement, so its plan is kept.
        INSERT INTO operations (operation_id, owner_id, conversation_id, state, format, before_seq, after_seq,
                                notify_url, since, until, senders, compression, max_part_bytes,
                                schedule_id, due_at, created_at, updated_at, traceparent)
        SELECT p_operation_id, p_owner_id, p_conversation_id, 'QUEUED', r.format, r.before_seq, r.after_seq,
               r.notify_url, r.since, r.until, r.senders, r.compression, r.max_part_bytes,
               p_schedule_id, p_due_at, coalesce(p_created_at, now()), coalesce(p_created_at, now()), p_traceparent
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
        SELECT r.* INTO accepted FROM operation_representations r
         WHERE r.operation_id = create_operation_v1.operation_id;
    END IF;
END;
$$;

-- create_export_schedule (migration 0013) with its checks those of a submit (begin_creation_v1), and the creating
-- request's trace context stored in the same statement.
CREATE FUNCTION create_export_schedule_v2(
    p_schedule_id text, p_owner_id text, p_conversation_id text, p_idempotency_key text, p_fingerprint text,
    p_replay_window_seconds float8, p_max_schedules integer, p_every text, p_start_at timestamptz, p_mode text,
    p_request jsonb, p_traceparent text, OUT outcome submit_outcome, OUT schedule_id text)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT b.outcome, b.earlier_id INTO outcome, schedule_id
      FROM begin_creation_v1(p_owner_id, p_conversation_id, p_idempotency_key, p_fingerprint,
                             p_replay_window_seconds, 'schedule') b;
    IF outcome IS NOT NULL THEN
        RETURN;
    END IF;
    IF (SELECT count(*) FROM export_schedules s WHERE s.owner_id = p_owner_id) >= p_max_schedules THEN
        outcome := 'quota';
        RETURN;
    END IF;
    INSERT INTO export_schedules (schedule_id, owner_id, conversation_id, every, start_at, mode, request,
                                  next_run_at, watermark, traceparent)
    VALUES (p_schedule_id, p_owner_id, p_conversation_id, p_every, coalesce(p_start_at, now()), p_mode, p_request,
            coalesce(p_start_at, now()), coalesce((p_request->>'after_seq')::bigint, 0), p_traceparent);
    IF p_idempotency_key IS NOT NULL THEN
        INSERT INTO idempotency_keys (owner_id, idempotency_key, fingerprint, schedule_id)
        VALUES (p_owner_id, p_idempotency_key, p_fingerprint, p_schedule_id);
    END IF;
    schedule_id := p_schedule_id;
    outcome := 'created';
END;
$$;
