-- The submit takes the export request as one JSON object (README: API reference, Submit; Rolling deploys):
-- its members are the request's fields (shared/export_request.py), named as the columns of operations that
-- store them. The rules are those of submit_export (migration 0008), in the same order. submit_export
-- stays, with its arguments, for the API processes of the previous release while a deploy rolls; a later
-- migration drops it once nothing calls it. A new field of the request is a new column and a new version of this function
-- beside this one, for the same reason.
--
-- The outcomes are an enum type, so that the function can answer nothing else and a test can compare them
-- with the API's (shared.repository.submissions.SubmitOutcome).
CREATE TYPE submit_outcome AS ENUM ('not_member', 'reused', 'expired', 'quota', 'replayed', 'created');

CREATE FUNCTION submit_export_v2(
    p_operation_id text, p_owner_id text, p_conversation_id text, p_idempotency_key text, p_fingerprint text,
    p_replay_window_seconds float8, p_max_active integer, p_active_states text[], p_routing_key text,
    p_request jsonb, OUT outcome submit_outcome, OUT operation_id text)
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
    -- jsonb_populate_record reads each member as its column's type. A static statement, not one built from
    -- the members: its plan is kept, and building one cost ~0.2 ms a submit (README: Benchmark).
    INSERT INTO operations (operation_id, owner_id, conversation_id, state, format, before_seq, after_seq,
                            notify_url, since, until, senders, compression, max_part_bytes)
    SELECT p_operation_id, p_owner_id, p_conversation_id, 'QUEUED', r.format, r.before_seq, r.after_seq,
           r.notify_url, r.since, r.until, r.senders, r.compression, r.max_part_bytes
      FROM jsonb_populate_record(NULL::operations, p_request) r;
    INSERT INTO idempotency_keys (owner_id, idempotency_key, fingerprint, operation_id)
    VALUES (p_owner_id, p_idempotency_key, p_fingerprint, p_operation_id);
    INSERT INTO outbox (operation_id, routing_key, payload)
    VALUES (p_operation_id, p_routing_key, jsonb_build_object('operation_id', p_operation_id));
    operation_id := p_operation_id;
    outcome := 'created';
END;
$$;

-- The previous release's submit, kept with its arguments and answers, now a call of the one above, so the
-- rules are written once.
CREATE OR REPLACE FUNCTION submit_export(
    p_operation_id text, p_owner_id text, p_conversation_id text, p_idempotency_key text, p_fingerprint text,
    p_replay_window_seconds float8, p_max_active integer, p_active_states text[], p_routing_key text,
    p_format text, p_before_seq bigint, p_after_seq bigint, p_notify_url text, p_since timestamptz,
    p_until timestamptz, p_senders text[], p_compression text, p_max_part_bytes bigint,
    OUT outcome text, OUT operation_id text)
LANGUAGE sql AS $$
    SELECT s.outcome::text, s.operation_id
      FROM submit_export_v2(p_operation_id, p_owner_id, p_conversation_id, p_idempotency_key, p_fingerprint,
                            p_replay_window_seconds, p_max_active, p_active_states, p_routing_key,
                            jsonb_build_object('format', p_format, 'before_seq', p_before_seq,
                                               'after_seq', p_after_seq, 'notify_url', p_notify_url,
                                               'since', p_since, 'until', p_until, 'senders', p_senders,
                                               'compression', p_compression, 'max_part_bytes', p_max_part_bytes)) s
$$;
