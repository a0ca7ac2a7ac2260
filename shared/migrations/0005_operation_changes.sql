-- Every change an API client can see bumps the operation's version and is announced on the channel
-- chatexport_operation_changes, so that long polls and event streams wait on a LISTEN instead of querying
-- in a loop (README: API reference, Waiting for a change). The payload is
-- '<operation_id> <version> <state>'; a NOTIFY is delivered when its transaction commits, and Postgres
-- folds identical payloads of one transaction into one. A heartbeat, which moves only the lease, is no
-- change. The version is the event id of the event stream.
ALTER TABLE operations ADD COLUMN version bigint NOT NULL DEFAULT 1;

CREATE FUNCTION operation_versioned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.state, NEW.updated_at, NEW.attempt, NEW.progress_phase, NEW.messages_written, NEW.bytes_written,
        NEW.snapshot_max_seq, NEW.retry_at, NEW.error_code, NEW.error_message, NEW.result_key,
        NEW.result_expires_at, NEW.finished_at)
       IS DISTINCT FROM
       (OLD.state, OLD.updated_at, OLD.attempt, OLD.progress_phase, OLD.messages_written, OLD.bytes_written,
        OLD.snapshot_max_seq, OLD.retry_at, OLD.error_code, OLD.error_message, OLD.result_key,
        OLD.result_expires_at, OLD.finished_at) THEN
        NEW.version := OLD.version + 1;
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER operation_versioned BEFORE UPDATE ON operations
    FOR EACH ROW EXECUTE FUNCTION operation_versioned();

CREATE FUNCTION operation_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('chatexport_operation_changes', NEW.operation_id || ' ' || NEW.version || ' ' || NEW.state);
    RETURN NULL;
END;
$$;
CREATE TRIGGER operation_changed AFTER UPDATE ON operations
    FOR EACH ROW WHEN (NEW.version <> OLD.version) EXECUTE FUNCTION operation_changed();

-- The representation's columns, and now the version (a view may only gain columns at its end).
CREATE OR REPLACE VIEW operation_representations AS
SELECT operation_id, kind, owner_id, conversation_id, format, before_seq, after_seq, state, created_at,
       updated_at, attempt, generation, progress_phase, messages_written, bytes_written, snapshot_max_seq,
       retry_at, error_code, error_message, result_key, result_size_bytes, result_sha256, result_message_count,
       result_expires_at, finished_at, lease_owner, lease_expires_at,
       extract(epoch FROM now() - created_at)::float8 AS age_seconds, version
FROM operations;
