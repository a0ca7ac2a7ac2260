-- Chunks of a big export (docs/chunks.md: Chunked exports): contiguous seq ranges of one operation, planned
-- at its first claim under that claim's snapshot, each with a lease and a fencing generation of its own.
-- A finished chunk's recorded output (object_key, size_bytes, sha256) is never redone. The previous release
-- never plans chunks and never reads this table, so it runs on beside this one while a deploy rolls
-- (docs/deploy.md: Rolling deploys).
CREATE TABLE export_chunks (
    operation_id text NOT NULL REFERENCES operations (operation_id) ON DELETE CASCADE,
    chunk_no integer NOT NULL CHECK (chunk_no >= 1),
    -- The chunk holds the seqs after_seq < seq <= last_seq.
    after_seq bigint NOT NULL,
    last_seq bigint NOT NULL CHECK (last_seq > after_seq),
    estimated_bytes bigint NOT NULL,
    state text NOT NULL DEFAULT 'PENDING' CHECK (state IN ('PENDING', 'QUEUED', 'RUNNING', 'DONE', 'FAILED')),
    generation bigint NOT NULL DEFAULT 0,
    attempts integer NOT NULL DEFAULT 0,
    lease_owner text,
    lease_expires_at timestamptz,
    not_before timestamptz,
    -- The object the current generation writes (or wrote, once DONE).
    object_key text,
    messages_written bigint NOT NULL DEFAULT 0,
    bytes_written bigint NOT NULL DEFAULT 0,
    size_bytes bigint,
    sha256 text,
    message_count bigint,
    error_code text,
    error_message text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (operation_id, chunk_no)
);
-- The janitor asks which listed keys a chunk names.
CREATE INDEX export_chunks_object_key ON export_chunks (object_key) WHERE object_key IS NOT NULL;
