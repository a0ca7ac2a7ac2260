-- step: pre
-- The bytes an export will store, as soon as its worker knows them (docs/api.md: Operations, Operation): an export
-- with media records its messages' estimate and the files it plans to include before its first byte. This
-- release's view of the representation (migration 0025) shows it (a view may only gain columns at its end) and
-- operation_versioned (migration 0025) watches it, so a poll sees it appear. The previous release neither writes
-- nor reads it.

ALTER TABLE operations ADD COLUMN estimate_bytes bigint;

CREATE OR REPLACE VIEW operation_representations_v2 AS
SELECT operation_id, kind, owner_id, conversation_id, format, before_seq, after_seq, state, created_at,
       updated_at, attempt, generation, progress_phase, messages_written, bytes_written, snapshot_max_seq,
       retry_at, error_code, error_message, result_key, result_size_bytes, result_sha256, result_message_count,
       result_expires_at, finished_at, lease_owner, lease_expires_at,
       extract(epoch FROM now() - created_at)::float8 AS age_seconds, version,
       since, until, senders, compression, max_part_bytes, result_parts, schedule_id, due_at,
       media, media_types, media_max_file_bytes, media_max_total_bytes, estimate_bytes
FROM operations;

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
        NEW.media_max_file_bytes, NEW.media_max_total_bytes, NEW.estimate_bytes)
       IS DISTINCT FROM
       (OLD.operation_id, OLD.kind, OLD.owner_id, OLD.conversation_id, OLD.format, OLD.before_seq,
        OLD.after_seq, OLD.state, OLD.created_at, OLD.updated_at, OLD.attempt, OLD.progress_phase,
        OLD.messages_written, OLD.bytes_written, OLD.snapshot_max_seq, OLD.retry_at, OLD.error_code,
        OLD.error_message, OLD.result_key, OLD.result_size_bytes, OLD.result_sha256, OLD.result_message_count,
        OLD.result_expires_at, OLD.finished_at, OLD.since, OLD.until, OLD.senders, OLD.compression,
        OLD.max_part_bytes, OLD.result_parts, OLD.schedule_id, OLD.due_at, OLD.media, OLD.media_types,
        OLD.media_max_file_bytes, OLD.media_max_total_bytes, OLD.estimate_bytes) THEN
        NEW.version := OLD.version + 1;
    END IF;
    RETURN NEW;
END;
$$;
