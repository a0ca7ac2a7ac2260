-- step: pre
-- One lease vocabulary (docs/architecture.md: Leases and fencing): a chunk's claim, extend, finish and release,
-- and a completion callback's claim and the record of its attempts, are versioned functions beside the
-- operation's (claim_export, claim_lease, succeed_export: migrations 0011 and 0017), each called by a one-line
-- wrapper in shared/repository. Their rules are those of the statements they replace, unchanged; the
-- previous release runs those statements itself and needs nothing of this migration.

-- A chunk's claim: its lease with the chunk's generation + 1 and the object that generation writes
-- (<p_key_stem><generation>.<p_extension>), when its operation is RUNNING, its state one of p_claimable, its
-- lease (if any) expired and its retry time (if any) reached. chunk is NULL when it was not claimed.
CREATE FUNCTION claim_chunk_v1(
    p_operation_id text, p_chunk_no integer, p_worker_id text, p_lease_seconds float8, p_key_stem text,
    p_extension text, p_claimable text[],
    OUT chunk export_chunks, OUT previous_key text, OUT took_over boolean, OUT first_chunk boolean,
    OUT last_chunk boolean, OUT operation operations)
LANGUAGE plpgsql AS $$
BEGIN
    -- Locked first, so that what the earlier generation left is read under the same lock as the claim.
    SELECT c.object_key, c.lease_owner IS NOT NULL INTO previous_key, took_over
      FROM export_chunks c WHERE c.operation_id = p_operation_id AND c.chunk_no = p_chunk_no FOR UPDATE;
    UPDATE export_chunks c SET
        state = 'RUNNING', generation = c.generation + 1, lease_owner = p_worker_id,
        lease_expires_at = now() + make_interval(secs => p_lease_seconds),
        object_key = p_key_stem || (c.generation + 1) || '.' || p_extension,
        messages_written = 0, bytes_written = 0, error_code = NULL, error_message = NULL, updated_at = now()
      FROM operations o
     WHERE c.operation_id = p_operation_id AND c.chunk_no = p_chunk_no AND o.operation_id = c.operation_id
       AND o.state = 'RUNNING' AND c.state = ANY(p_claimable) AND (c.state <> 'RUNNING' OR c.lease_expires_at < now())
       AND (c.not_before IS NULL OR c.not_before <= now())
    RETURNING c.* INTO chunk;
    IF NOT FOUND THEN
        chunk := NULL;
        RETURN;
    END IF;
    SELECT o.* INTO operation FROM operations o WHERE o.operation_id = p_operation_id;
    first_chunk := chunk.after_seq = (SELECT min(c.after_seq) FROM export_chunks c WHERE c.operation_id = p_operation_id);
    last_chunk := chunk.last_seq = (SELECT max(c.last_seq) FROM export_chunks c WHERE c.operation_id = p_operation_id);
END;
$$;

-- Every write of a chunk's holder is fenced on its generation, on the chunk being RUNNING and on the operation
-- being RUNNING (docs/chunks.md: Chunked exports).

-- The holder's heartbeat and progress; false when the lease is lost or the export no longer RUNNING.
CREATE FUNCTION extend_chunk_v1(
    p_operation_id text, p_chunk_no integer, p_generation bigint, p_lease_seconds float8,
    p_messages_written bigint, p_bytes_written bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE export_chunks c SET lease_expires_at = now() + make_interval(secs => p_lease_seconds),
        messages_written = p_messages_written, bytes_written = p_bytes_written, updated_at = now()
     WHERE c.operation_id = p_operation_id AND c.chunk_no = p_chunk_no AND c.generation = p_generation
       AND c.state = 'RUNNING'
       AND EXISTS (SELECT 1 FROM operations o WHERE o.operation_id = p_operation_id AND o.state = 'RUNNING');
    RETURN FOUND;
END;
$$;

-- The holder's verified output, and the chunk DONE; false, recording nothing, when the lease is lost or the
-- export no longer RUNNING. With p_ended_at_seq the output ends short of the range (docs/chunks.md: Split
-- results): the range ends there and the rest becomes a new PENDING chunk, numbered under the operation's row
-- lock so that two chunks ending early at once number theirs apart.
CREATE FUNCTION finish_chunk_v1(
    p_operation_id text, p_chunk_no integer, p_generation bigint, p_size_bytes bigint, p_sha256 text,
    p_message_count bigint, p_first_message_seq bigint, p_last_message_seq bigint, p_ended_at_seq bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    was export_chunks;
BEGIN
    IF p_ended_at_seq IS NOT NULL THEN
        PERFORM 1 FROM operations o WHERE o.operation_id = p_operation_id FOR UPDATE;
    END IF;
    -- The fence on the row itself, so that a claim committed while this waited for the row is seen.
    SELECT c.* INTO was FROM export_chunks c
     WHERE c.operation_id = p_operation_id AND c.chunk_no = p_chunk_no AND c.generation = p_generation
       AND c.state = 'RUNNING'
       AND EXISTS (SELECT 1 FROM operations o WHERE o.operation_id = p_operation_id AND o.state = 'RUNNING')
       FOR UPDATE OF c;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE export_chunks c SET state = 'DONE', size_bytes = p_size_bytes, sha256 = p_sha256,
        message_count = p_message_count, messages_written = p_message_count, bytes_written = p_size_bytes,
        first_message_seq = p_first_message_seq, last_message_seq = p_last_message_seq,
        last_seq = coalesce(p_ended_at_seq, was.last_seq),
        estimated_bytes = was.estimated_bytes * (coalesce(p_ended_at_seq, was.last_seq) - was.after_seq)
            / (was.last_seq - was.after_seq),
        lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
     WHERE c.operation_id = p_operation_id AND c.chunk_no = p_chunk_no;
    IF p_ended_at_seq IS NOT NULL AND p_ended_at_seq < was.last_seq THEN
        INSERT INTO export_chunks (operation_id, chunk_no, after_seq, last_seq, estimated_bytes)
        SELECT p_operation_id, max(c.chunk_no) + 1, p_ended_at_seq, was.last_seq,
               was.estimated_bytes * (was.last_seq - p_ended_at_seq) / (was.last_seq - was.after_seq)
          FROM export_chunks c WHERE c.operation_id = p_operation_id;
    END IF;
    RETURN true;
END;
$$;

-- The end of a holder's lease: with p_retry_delay_seconds NULL a hand-back (PENDING, no attempt spent); else a
-- failed attempt, PENDING again after the delay or FAILED with the error once p_max_attempts are spent. The new
-- state; NULL when the lease was no longer held.
CREATE FUNCTION release_chunk_v1(
    p_operation_id text, p_chunk_no integer, p_generation bigint, p_retry_delay_seconds float8,
    p_error_code text, p_error_message text, p_max_attempts integer)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    released text;
BEGIN
    UPDATE export_chunks c SET
        attempts = c.attempts + (CASE WHEN p_retry_delay_seconds IS NULL THEN 0 ELSE 1 END),
        state = CASE WHEN p_retry_delay_seconds IS NOT NULL AND c.attempts + 1 >= p_max_attempts THEN 'FAILED'
                     ELSE 'PENDING' END,
        not_before = now() + make_interval(secs => coalesce(p_retry_delay_seconds, 0)),
        error_code = p_error_code, error_message = p_error_message, lease_owner = NULL, lease_expires_at = NULL,
        updated_at = now()
     WHERE c.operation_id = p_operation_id AND c.chunk_no = p_chunk_no AND c.generation = p_generation
       AND c.state = 'RUNNING'
    RETURNING c.state INTO released;
    RETURN released;
END;
$$;

-- Up to p_limit due callback deliveries, oldest first, each leased for p_lease_seconds (due again after that
-- unless its attempt is recorded) with its fencing generation bumped, in one statement. Subqueries, not
-- joins, read the trace context: only the deliveries are locked, and only until the statement commits. This
-- and the next are SQL functions, planned at each call: one call serves a whole batch of deliveries.
CREATE FUNCTION claim_webhook_deliveries_v1(p_limit integer, p_lease_seconds float8)
RETURNS TABLE (delivery webhook_deliveries, age_seconds float8, created_at_epoch bigint, traceparent text)
LANGUAGE sql AS $$
    WITH due AS (
        SELECT w.delivery_id FROM webhook_deliveries w
         WHERE w.delivered_at IS NULL AND w.gave_up_at IS NULL AND w.next_attempt_at <= now()
         ORDER BY w.next_attempt_at, w.delivery_id
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    )
    UPDATE webhook_deliveries d
       SET next_attempt_at = now() + make_interval(secs => p_lease_seconds), generation = d.generation + 1
      FROM due WHERE d.delivery_id = due.delivery_id
    RETURNING d, extract(epoch FROM now() - d.created_at)::float8, extract(epoch FROM d.created_at)::bigint,
              coalesce((SELECT o.traceparent FROM operations o WHERE o.operation_id = d.operation_id),
                       (SELECT s.traceparent FROM export_schedules s WHERE s.schedule_id = d.schedule_id));
$$;

-- The attempts of claimed deliveries, the n-th element of each array one attempt's: each delivery delivered
-- on a 2xx, else due again after its retry seconds or given up when those are NULL, and one webhook_attempts
-- row each. An attempt whose delivery was claimed again since (another generation) changes nothing. The ids
-- of the deliveries recorded.
CREATE FUNCTION record_webhook_attempts_v1(
    p_delivery_ids bigint[], p_generations bigint[], p_delivered boolean[], p_status_codes integer[],
    p_durations_ms integer[], p_errors text[], p_retry_seconds float8[], p_attempted_at timestamptz[])
RETURNS SETOF bigint LANGUAGE sql AS $$
    WITH outcome AS (
        SELECT * FROM unnest(p_delivery_ids, p_generations, p_delivered, p_status_codes, p_durations_ms, p_errors,
                             p_retry_seconds, p_attempted_at)
            AS o(delivery_id, generation, delivered, status_code, duration_ms, error, retry_seconds, attempted_at)
    ), recorded AS (
        UPDATE webhook_deliveries d SET attempts = d.attempts + 1,
            delivered_at = CASE WHEN o.delivered THEN now() END,
            gave_up_at = CASE WHEN NOT o.delivered AND o.retry_seconds IS NULL THEN now() END,
            next_attempt_at = CASE WHEN o.retry_seconds IS NULL THEN d.next_attempt_at
                                   ELSE now() + make_interval(secs => o.retry_seconds) END
          FROM outcome o
         WHERE d.delivery_id = o.delivery_id AND d.generation = o.generation
        RETURNING d.delivery_id, d.attempts
    )
    INSERT INTO webhook_attempts (delivery_id, attempt, attempted_at, status_code, duration_ms, error)
    SELECT r.delivery_id, r.attempts, o.attempted_at, o.status_code, o.duration_ms, o.error
      FROM recorded r JOIN outcome o USING (delivery_id)
    RETURNING delivery_id;
$$;
