-- The submit and its answer in one round trip (docs/benchmark.md: Benchmark, Counts): the API read the
-- operation back after every accepted submit to answer its 202, and with tracing on stored the trace context
-- in a transaction of three more. This function runs submit_export_v2 (migration 0009, rules unchanged),
-- stores p_traceparent (migration 0014) with an operation it created, and, when it accepted (created or
-- replayed), reads the operation as the status monitor shows it, after those writes and in the same call.
-- Rolling deploys: the previous release calls submit_export_v2, which stays. The OUT row has the view's type:
-- a later migration may add columns to the view (callers select (accepted).*), but one that drops it must
-- drop and create this function again.
CREATE FUNCTION submit_export_answered(
    p_operation_id text, p_owner_id text, p_conversation_id text, p_idempotency_key text, p_fingerprint text,
    p_replay_window_seconds float8, p_max_active integer, p_active_states text[], p_routing_key text,
    p_request jsonb, p_traceparent text, OUT outcome submit_outcome, OUT operation_id text,
    OUT accepted operation_representations)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT s.outcome, s.operation_id INTO outcome, operation_id
      FROM submit_export_v2(p_operation_id, p_owner_id, p_conversation_id, p_idempotency_key, p_fingerprint,
                            p_replay_window_seconds, p_max_active, p_active_states, p_routing_key, p_request) s;
    IF outcome = 'created' AND p_traceparent IS NOT NULL THEN
        UPDATE operations o SET traceparent = p_traceparent WHERE o.operation_id = p_operation_id;
    END IF;
    IF outcome IN ('created', 'replayed') THEN
        SELECT r.* INTO accepted FROM operation_representations r
         WHERE r.operation_id = submit_export_answered.operation_id;
    END IF;
END;
$$;
