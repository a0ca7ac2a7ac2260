-- step: pre
-- Replies and edits in the message store (docs/api.md: Message store, Replies and edits). A reply names the
-- seq of the message it answers; an edit replaces a message's body, keeps the body it replaced in
-- message_edits under the conversation's next edit version, and an export shows every body as of the edit
-- version its first claim fixed (docs/api.md: Submitting an export, The file), so that a retried attempt or a
-- chunk writes the same bytes. The previous release neither writes nor reads any of this: its sends leave the
-- new columns NULL, its exports show the bodies as they are.

-- Tables in the order the running parts lock them (a claim: operations, then conversations; a send:
-- conversations, then messages), so that the migration's locks never wait in a cycle with theirs.

-- The conversation's last edit version when the export's first claim fixed its snapshot: NULL for an
-- operation whose snapshot was fixed before this migration, which is version 0 (no edit existed then).
ALTER TABLE operations ADD COLUMN snapshot_edit_version bigint;

-- The conversation's last edit version, taken under the same row lock as its seqs: a committed value says
-- every edit up to it is committed, as last_seq says of messages.
ALTER TABLE conversations ADD COLUMN last_edit_version bigint NOT NULL DEFAULT 0;

ALTER TABLE messages
    ADD COLUMN reply_to_seq bigint,
    ADD COLUMN edited_at timestamptz,
    ADD COLUMN edit_version bigint;

-- The body (and edit time) that the edit of edit_version replaced: a message's body as of version v is that
-- of its first edit above v, or its body when it has none.
CREATE TABLE message_edits (
    conversation_id text NOT NULL,
    seq bigint NOT NULL,
    edit_version bigint NOT NULL,
    previous_body text NOT NULL,
    previous_edited_at timestamptz,
    PRIMARY KEY (conversation_id, seq, edit_version),
    FOREIGN KEY (conversation_id, seq) REFERENCES messages (conversation_id, seq) ON DELETE CASCADE
);

-- operation_versioned (migration 0015) as it was, and where a claim fixes the snapshot's last seq it fixes
-- the edit version too: in the trigger every claim function already runs, so the previous release's claims
-- fix it as well and no trigger is added.
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
