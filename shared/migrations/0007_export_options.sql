-- Export options (README: API reference, Export options): a time window on sent_at, a set of senders, the
-- file format and its compression, and a part size for split results. Existing operations read as the
-- defaults they were made with: every message of their seq range, one uncompressed JSONL file.
ALTER TABLE operations
    ADD COLUMN since timestamptz,
    ADD COLUMN until timestamptz,
    ADD COLUMN senders text[],
    ADD COLUMN compression text NOT NULL DEFAULT 'none' CHECK (compression IN ('none', 'gzip')),
    ADD COLUMN max_part_bytes bigint,
    -- A split result's parts as published: [{number, key, size_bytes, sha256, message_count, first_seq,
    -- last_seq}]; NULL for a single file, whose figures are the result_* columns.
    ADD COLUMN result_parts jsonb,
    ADD CONSTRAINT operations_format CHECK (format IN ('jsonl', 'csv', 'html'));

-- A split artifact's record names its generation's folder (every part's key is under it, derived from the
-- operation and the generation, so the record made before the first part's upload names them all); its
-- verified parts are recorded here when it becomes COMPLETE, in the shape of operations.result_parts.
ALTER TABLE artifacts ADD COLUMN parts jsonb;

-- The representation's columns, and now the options and the parts (a view may only gain columns at its end).
CREATE OR REPLACE VIEW operation_representations AS
SELECT operation_id, kind, owner_id, conversation_id, format, before_seq, after_seq, state, created_at,
       updated_at, attempt, generation, progress_phase, messages_written, bytes_written, snapshot_max_seq,
       retry_at, error_code, error_message, result_key, result_size_bytes, result_sha256, result_message_count,
       result_expires_at, finished_at, lease_owner, lease_expires_at,
       extract(epoch FROM now() - created_at)::float8 AS age_seconds, version,
       since, until, senders, compression, max_part_bytes, result_parts
FROM operations;
