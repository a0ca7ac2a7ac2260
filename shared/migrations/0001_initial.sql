-- The message store (contract section 4) and the export operations (sections 5 and 6).

CREATE TABLE conversations (
    conversation_id text PRIMARY KEY,
    -- The last seq handed out; bumped under the row lock by every store, so seqs are strictly
    -- increasing, never reused, and every seq <= last_seq is committed once last_seq is.
    last_seq bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE conversation_members (
    conversation_id text NOT NULL REFERENCES conversations (conversation_id) ON DELETE CASCADE,
    user_id text NOT NULL,
    added_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, user_id)
);
CREATE INDEX conversation_members_user ON conversation_members (user_id);

CREATE TABLE messages (
    conversation_id text NOT NULL REFERENCES conversations (conversation_id),
    seq bigint NOT NULL,
    message_id text NOT NULL,
    sender_id text NOT NULL,
    body text NOT NULL,
    -- Stored at millisecond precision so the file and the read API print the same string (5.6).
    sent_at timestamptz NOT NULL,
    recalled_at timestamptz,
    PRIMARY KEY (conversation_id, seq),
    CONSTRAINT messages_conversation_message_id UNIQUE (conversation_id, message_id)
);

CREATE TABLE operations (
    operation_id text PRIMARY KEY,
    kind text NOT NULL DEFAULT 'conversation_export',
    owner_id text NOT NULL,
    conversation_id text NOT NULL,
    format text NOT NULL,
    before_seq bigint,
    after_seq bigint NOT NULL DEFAULT 0,
    state text NOT NULL CHECK (state IN ('QUEUED', 'RUNNING', 'RETRY_AT', 'CANCEL_REQUESTED', 'SUCCEEDED',
                                         'CANCELED', 'FAILED', 'FAILED_REPAIR', 'EXPIRED')),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- Attempts started (claims) and the fencing generation of the current lease holder.
    attempt integer NOT NULL DEFAULT 0,
    generation bigint NOT NULL DEFAULT 0,
    lease_owner text,
    lease_expires_at timestamptz,
    snapshot_max_seq bigint,
    progress_phase text,
    messages_written bigint NOT NULL DEFAULT 0,
    bytes_written bigint NOT NULL DEFAULT 0,
    retry_at timestamptz,
    error_code text,
    error_message text,
    result_key text,
    result_size_bytes bigint,
    result_sha256 text,
    result_message_count bigint,
    result_expires_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX operations_owner_created ON operations (owner_id, created_at DESC, operation_id DESC);
CREATE INDEX operations_active ON operations (state, updated_at)
    WHERE state IN ('QUEUED', 'RUNNING', 'RETRY_AT', 'CANCEL_REQUESTED', 'FAILED_REPAIR');
CREATE INDEX operations_result_expiry ON operations (result_expires_at) WHERE state = 'SUCCEEDED';
CREATE INDEX operations_created ON operations (created_at);

CREATE TABLE idempotency_keys (
    owner_id text NOT NULL,
    idempotency_key text NOT NULL,
    fingerprint text NOT NULL,
    operation_id text NOT NULL REFERENCES operations (operation_id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner_id, idempotency_key)
);
CREATE INDEX idempotency_keys_operation ON idempotency_keys (operation_id);

-- One row per (operation, generation): the object key is recorded here before the first byte is
-- uploaded (contract section 6), so the janitor can tell published objects from orphans.
CREATE TABLE artifacts (
    operation_id text NOT NULL REFERENCES operations (operation_id) ON DELETE CASCADE,
    generation bigint NOT NULL,
    object_key text NOT NULL UNIQUE,
    upload_id text,
    state text NOT NULL CHECK (state IN ('WRITING', 'COMPLETE', 'PUBLISHED', 'DELETED')),
    size_bytes bigint,
    sha256 text,
    message_count bigint,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (operation_id, generation)
);

CREATE TABLE outbox (
    outbox_id bigserial PRIMARY KEY,
    operation_id text NOT NULL,
    routing_key text NOT NULL,
    payload jsonb NOT NULL,
    not_before timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    publish_attempts integer NOT NULL DEFAULT 0
);
-- The relay claims unpublished rows by this flag, never by an id watermark (PITFALLS: sequences).
CREATE INDEX outbox_unpublished ON outbox (not_before, outbox_id) WHERE published_at IS NULL;
CREATE INDEX outbox_operation ON outbox (operation_id);

CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('chatexport_outbox', NEW.outbox_id::text);
    RETURN NULL;
END;
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION outbox_notify();

CREATE TABLE access_events (
    access_event_id bigserial PRIMARY KEY,
    operation_id text NOT NULL,
    user_id text NOT NULL,
    action text NOT NULL,
    outcome text NOT NULL,
    occurred_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX access_events_operation ON access_events (operation_id, occurred_at);
