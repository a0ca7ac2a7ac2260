-- step: pre
-- Attachments (docs/api.md: Message store, Attachments): a member uploads a file into the conversation, then
-- sends a message that carries it. The row is written before the first byte goes to the bucket (UPLOADING) and
-- records the file's size, sha256 and CRC-32 once it is stored (STORED), so that the janitor knows every
-- object under the attachment prefix. The previous release neither writes nor reads any of this, and its
-- janitor sweeps only the export prefix.

CREATE TABLE attachments (
    attachment_id text PRIMARY KEY,
    conversation_id text NOT NULL REFERENCES conversations (conversation_id) ON DELETE CASCADE,
    uploader_id text NOT NULL,
    file_name text NOT NULL,
    content_type text NOT NULL,
    object_key text NOT NULL UNIQUE,
    state text NOT NULL CHECK (state IN ('UPLOADING', 'STORED')),
    size_bytes bigint,
    sha256 text,
    crc32 bigint,
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK (state = 'UPLOADING' OR (size_bytes IS NOT NULL AND sha256 IS NOT NULL AND crc32 IS NOT NULL))
);

-- The janitor looks for uploads that never finished.
CREATE INDEX attachments_uploading ON attachments (created_at) WHERE state = 'UPLOADING';

-- The attachments a message carries, in the order its send listed them; one attachment may be carried by
-- several messages.
CREATE TABLE message_attachments (
    conversation_id text NOT NULL,
    seq bigint NOT NULL,
    position smallint NOT NULL,
    attachment_id text NOT NULL REFERENCES attachments (attachment_id),
    PRIMARY KEY (conversation_id, seq, position),
    FOREIGN KEY (conversation_id, seq) REFERENCES messages (conversation_id, seq) ON DELETE CASCADE
);

CREATE INDEX message_attachments_attachment ON message_attachments (attachment_id);

-- How many attachments the message carries, NULL for none: an export looks them up only for a message that
-- has some.
ALTER TABLE messages ADD COLUMN attachment_count smallint;
