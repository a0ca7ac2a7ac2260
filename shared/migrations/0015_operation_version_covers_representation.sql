-- Every field of the operation's representation bumps its version, which is also its weak ETag
-- (docs/api.md: API reference, Conditional polls): migration 0005 watched the columns that changed then, and
-- later columns (the result's size, sha256, message count and parts, the export options, a run's schedule)
-- were left out. The lease and the fencing generation move without any change a client can see (a heartbeat,
-- a takeover), so they stay out; age_seconds is computed. A test compares this list with the view's columns.
CREATE OR REPLACE FUNCTION operation_versioned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.operation_id, NEW.kind, NEW.owner_id, NEW.conversation_id, NEW.format, NEW.before_seq,
        NEW.after_seq, NEW.state, NEW.created_at, NEW.updated_at, NEW.attempt, NEW.progress_phase,
        NEW.messages_written, NEW.bytes_written, NEW.snapshot_max_seq, NEW.retry_at, NEW.error_code,
        NEW.error_message, NEW.result_key, NEW.result_size_bytes, NEW.result_sha256, NEW.result_message_count,
        NEW.result_expires_at, NEW.finished_at, NEW.since, NEW.until, NEW.senders, NEW.compression,
        NEW.max_part_bytes, NEW.result_parts, NEW.schedule_id, NEW.due_at)
       IS DISTINCT FROM
       (OLD.operation_id, OLD.kind, OLD.owner_id, OLD.conversation_id, OLD.format, OLD.before_seq,
        OLD.after_seq, OLD.state, OLD.created_at, OLD.updated_at, OLD.attempt, OLD.progress_phase,
        OLD.messages_written, OLD.bytes_written, OLD.snapshot_max_seq, OLD.retry_at, OLD.error_code,
        OLD.error_message, OLD.result_key, OLD.result_size_bytes, OLD.result_sha256, OLD.result_message_count,
        OLD.result_expires_at, OLD.finished_at, OLD.since, OLD.until, OLD.senders, OLD.compression,
        OLD.max_part_bytes, OLD.result_parts, OLD.schedule_id, OLD.due_at) THEN
        NEW.version := OLD.version + 1;
    END IF;
    RETURN NEW;
END;
$$;
