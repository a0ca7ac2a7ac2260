-- step: pre
-- Exports with media (docs/api.md: Submitting an export, Exports with media): the request's four
-- new fields, stored as every request field is, in the column of its name; the representation's view of this
-- release, operation_representations_v2, shows them; create_operation_v2 is create_operation_v1 (migration 0020)
-- storing them too. The previous release submits through create_operation_v1, which leaves them NULL: no media.
-- It reads operation_representations with `*` through prepared statements, which Postgres refuses to run once
-- their result changes shape, so that view keeps its columns (docs/deploy.md: What each mix of releases may do).

ALTER TABLE operations
    ADD COLUMN media boolean,
    ADD COLUMN media_types text[],
    ADD COLUMN media_max_file_bytes bigint,
    ADD COLUMN media_max_total_bytes bigint;

CREATE VIEW operation_representations_v2 AS
SELECT operation_id, kind, owner_id, conversation_id, format, before_seq, after_seq, state, created_at,
       updated_at, attempt, generation, progress_phase, messages_written, bytes_written, snapshot_max_seq,
       retry_at, error_code, error_message, result_key, result_size_bytes, result_sha256, result_message_count,
       result_expires_at, finished_at, lease_owner, lease_expires_at,
       extract(epoch FROM now() - created_at)::float8 AS age_seconds, version,
       since, until, senders, compression, max_part_bytes, result_parts, schedule_id, due_at,
       media, media_types, media_max_file_bytes, media_max_total_bytes
FROM operations;

-- operation_versioned as migration 0023 left it, watching the new columns too: every column of the representation
-- bumps its version (they never change after the insert, but the rule has no exceptions to remember).
CREATE OR REPLACE FUNCTION operation_versioned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.snapshot_max_seq IS NULL AND NEW.snapshot_max_seq IS NOT NULL THEN
        NEW.snapshot_edit_version := (SELECT c.last_edit_version FROM conversations c
                                       WHERE c.conversation_id = NEW.conversation_id);
    END IF;
    IF (NEW.operation_id, NEW.kind, NEW.owner_id, NEW.conversation_id, NEW.format, NEW.before_seq,
        NEW.after_seq, NEW.state, NEW.created_at, NEW.updated_at, NEW.attempt, NEW.progress_phase,
        NEW.messages_written, NEW.bytes_written, NEW.snapshot_max_seq, NEW.retry_at, NEW.error_code,
        NEW.error_message, NEW.result_key, NEW.result_size_bytes, NEW.result_sha256, NEW.result_message_count,
        NEW.result_expires_at, NEW.finished_at, NEW.since, NEW.until, NEW.senders, NEW.compression,
        NEW.max_part_bytes, NEW.result_parts, NEW.schedule_id, NEW.due_at, NEW.media, NEW.media_types,
        NEW.media_max_file_bytes, NEW.media_max_total_bytes)
       IS DISTINCT FROM
       (OLD.operation_id, OLD.kind, OLD.owner_id, OLD.conversation_id, OLD.format, OLD.before_seq,
        OLD.after_seq, OLD.state, OLD.created_at, OLD.updated_at, OLD.attempt, OLD.progress_phase,
        OLD.messages_written, OLD.bytes_written, OLD.snapshot_max_seq, OLD.retry_at, OLD.error_code,
        OLD.error_message, OLD.result_key, OLD.result_size_bytes, OLD.result_sha256, OLD.result_message_count,
        OLD.result_expires_at, OLD.finished_at, OLD.since, OLD.until, OLD.senders, OLD.compression,
        OLD.max_part_bytes, OLD.result_parts, OLD.schedule_id, OLD.due_at, OLD.media, OLD.media_types,
        OLD.media_max_file_bytes, OLD.media_max_total_bytes) THEN
        NEW.version := OLD.version + 1;
    END IF;
    RETURN NEW;
END;
$$;

CREATE FUNCTION create_operation_v2(
    p_operation_id text, p_owner_id text, p_conversation_id text, p_request jsonb,
    p_max_active integer, p_active_states text[], p_routing_key text, p_payload_version integer,
    p_idempotency_key text, p_fingerprint text, p_replay_window_seconds float8,
    p_schedule_id text, p_due_at timestamptz, p_created_at timestamptz, p_traceparent text, p_answered boolean,
    OUT outcome submit_outcome, OUT operation_id text, OUT accepted operation_representations_v2)
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
         WHERE r.operation_id = create_operation_v2.operation_id;
    END IF;
END;
$$;
