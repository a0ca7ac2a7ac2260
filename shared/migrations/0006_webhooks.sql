-- Completion callbacks (README: API reference, Completion callbacks). An operation may name a URL at
-- submit; when it ends SUCCEEDED, FAILED or CANCELED, or is parked in FAILED_REPAIR, a delivery row is
-- written by the transaction that ends it (the trigger below), and the relay sends it until it is
-- delivered or its retry time is spent. A requeued operation that ends again is a new event: a new row
-- with a new webhook_id. Every attempt is recorded.
ALTER TABLE operations ADD COLUMN notify_url text;

CREATE TABLE webhook_deliveries (
    delivery_id bigserial PRIMARY KEY,
    webhook_id text NOT NULL UNIQUE,
    operation_id text NOT NULL REFERENCES operations (operation_id) ON DELETE CASCADE,
    owner_id text NOT NULL,
    event_type text NOT NULL CHECK (event_type IN ('export.succeeded', 'export.failed', 'export.canceled',
                                                   'export.needs_repair')),
    url text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    attempts integer NOT NULL DEFAULT 0,
    delivered_at timestamptz,
    gave_up_at timestamptz
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE delivered_at IS NULL AND gave_up_at IS NULL;
CREATE INDEX webhook_deliveries_operation ON webhook_deliveries (operation_id);

CREATE TABLE webhook_attempts (
    delivery_id bigint NOT NULL REFERENCES webhook_deliveries (delivery_id) ON DELETE CASCADE,
    attempt integer NOT NULL,
    attempted_at timestamptz NOT NULL DEFAULT now(),
    status_code integer,
    duration_ms integer NOT NULL,
    error text,
    PRIMARY KEY (delivery_id, attempt)
);

CREATE FUNCTION operation_ended_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (webhook_id, operation_id, owner_id, event_type, url)
    VALUES ('msg_' || replace(gen_random_uuid()::text, '-', ''), NEW.operation_id, NEW.owner_id,
            CASE NEW.state WHEN 'SUCCEEDED' THEN 'export.succeeded' WHEN 'FAILED' THEN 'export.failed'
                           WHEN 'CANCELED' THEN 'export.canceled' ELSE 'export.needs_repair' END,
            NEW.notify_url);
    RETURN NULL;
END;
$$;
CREATE TRIGGER operation_ended_notify AFTER UPDATE OF state ON operations
    FOR EACH ROW
    WHEN (NEW.notify_url IS NOT NULL AND NEW.state IS DISTINCT FROM OLD.state
          AND NEW.state IN ('SUCCEEDED', 'FAILED', 'CANCELED', 'FAILED_REPAIR'))
    EXECUTE FUNCTION operation_ended_notify();
