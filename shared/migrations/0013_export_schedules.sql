-- Export schedules (docs/schedules.md: Scheduled exports). A schedule creates runs, each an ordinary
-- export operation that names its schedule and due time; the chain's watermark lives on the schedule row.
CREATE TABLE export_schedules (
    schedule_id text PRIMARY KEY,
    owner_id text NOT NULL,
    conversation_id text NOT NULL,
    -- The ISO 8601 duration as given (upper case); shared/cadence.py reads it.
    every text NOT NULL,
    start_at timestamptz NOT NULL,
    mode text NOT NULL CHECK (mode IN ('incremental', 'full')),
    -- The export request of every run, the submit's JSON object (shared/export_request.py); an incremental
    -- run's after_seq is the watermark instead.
    request jsonb NOT NULL,
    state text NOT NULL DEFAULT 'ACTIVE' CHECK (state IN ('ACTIVE', 'PAUSED')),
    paused_reason text CHECK (paused_reason IN ('USER', 'ACCESS_REVOKED', 'RUN_NEEDS_REPAIR')),
    waiting_reason text CHECK (waiting_reason IN ('ACTIVE_EXPORT_QUOTA')),
    next_run_at timestamptz,
    watermark bigint NOT NULL,
    last_operation_id text,
    version bigint NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT export_schedules_paused_with_reason CHECK ((state = 'PAUSED') = (paused_reason IS NOT NULL)),
    CONSTRAINT export_schedules_active_has_next CHECK (state = 'PAUSED' OR next_run_at IS NOT NULL)
);
CREATE INDEX export_schedules_due ON export_schedules (next_run_at) WHERE state = 'ACTIVE';
CREATE INDEX export_schedules_owner_created ON export_schedules (owner_id, created_at DESC, schedule_id DESC);

-- A run is created at most once per schedule and due time, whoever writes it (docs/schedules.md: Runs).
-- No foreign key: a run outlives its deleted schedule until its own retention ends.
ALTER TABLE operations ADD COLUMN schedule_id text, ADD COLUMN due_at timestamptz,
    ADD CONSTRAINT operations_schedule_due UNIQUE (schedule_id, due_at),
    ADD CONSTRAINT operations_run_has_due CHECK ((schedule_id IS NULL) = (due_at IS NULL));

-- One key space per user for submits and schedules: a key names an operation or a schedule.
ALTER TABLE idempotency_keys ALTER COLUMN operation_id DROP NOT NULL,
    ADD COLUMN schedule_id text REFERENCES export_schedules (schedule_id) ON DELETE CASCADE,
    ADD CONSTRAINT idempotency_keys_one_target CHECK (num_nonnulls(operation_id, schedule_id) = 1);
CREATE INDEX idempotency_keys_schedule ON idempotency_keys (schedule_id) WHERE schedule_id IS NOT NULL;

-- A schedule's own callbacks (schedule.paused) name the schedule instead of an operation.
ALTER TABLE webhook_deliveries ALTER COLUMN operation_id DROP NOT NULL,
    ADD COLUMN schedule_id text REFERENCES export_schedules (schedule_id) ON DELETE CASCADE,
    ADD CONSTRAINT webhook_deliveries_one_subject CHECK (num_nonnulls(operation_id, schedule_id) = 1),
    DROP CONSTRAINT webhook_deliveries_event_type_check,
    ADD CONSTRAINT webhook_deliveries_event_type_check CHECK (event_type IN (
        'export.succeeded', 'export.failed', 'export.canceled', 'export.needs_repair', 'schedule.paused'));
CREATE INDEX webhook_deliveries_schedule ON webhook_deliveries (schedule_id) WHERE schedule_id IS NOT NULL;

-- The representation's columns, and now the run's schedule (a view may only gain columns at its end).
CREATE OR REPLACE VIEW operation_representations AS
SELECT operation_id, kind, owner_id, conversation_id, format, before_seq, after_seq, state, created_at,
       updated_at, attempt, generation, progress_phase, messages_written, bytes_written, snapshot_max_seq,
       retry_at, error_code, error_message, result_key, result_size_bytes, result_sha256, result_message_count,
       result_expires_at, finished_at, lease_owner, lease_expires_at,
       extract(epoch FROM now() - created_at)::float8 AS age_seconds, version,
       since, until, senders, compression, max_part_bytes, result_parts, schedule_id, due_at
FROM operations;

-- Pause an ACTIVE schedule for a reason of the system's, and queue its schedule.paused callback when it has a
-- notify URL (docs/schedules.md: When a run cannot go on). A schedule already paused keeps its reason.
CREATE FUNCTION pause_export_schedule(p_schedule_id text, p_reason text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    paused export_schedules%ROWTYPE;
BEGIN
    UPDATE export_schedules SET state = 'PAUSED', paused_reason = p_reason, next_run_at = NULL,
        waiting_reason = NULL, version = version + 1, updated_at = now()
     WHERE schedule_id = p_schedule_id AND state = 'ACTIVE'
    RETURNING * INTO paused;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF paused.request->>'notify_url' IS NOT NULL THEN
        INSERT INTO webhook_deliveries (webhook_id, schedule_id, owner_id, event_type, url)
        VALUES ('msg_' || replace(gen_random_uuid()::text, '-', ''), p_schedule_id, paused.owner_id,
                'schedule.paused', paused.request->>'notify_url');
    END IF;
    RETURN true;
END;
$$;

-- What a run's end does to its schedule, in the transaction that ends it (docs/schedules.md: The chain):
-- a SUCCEEDED run that started at the watermark moves it to the run's snapshot (a full run: to the greater
-- snapshot); FAILED_REPAIR pauses the schedule until the run is repaired; a requeue out of FAILED_REPAIR
-- resumes it, firing as soon as the repaired run ends; a run refused for a revoked membership pauses it.
CREATE FUNCTION schedule_run_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'SUCCEEDED' THEN
        UPDATE export_schedules SET watermark = NEW.snapshot_max_seq, version = version + 1, updated_at = now()
         WHERE schedule_id = NEW.schedule_id AND NEW.snapshot_max_seq IS NOT NULL
           AND CASE mode WHEN 'incremental' THEN watermark = NEW.after_seq
                         ELSE watermark < NEW.snapshot_max_seq END;
    ELSIF NEW.state = 'FAILED_REPAIR' THEN
        PERFORM pause_export_schedule(NEW.schedule_id, 'RUN_NEEDS_REPAIR');
    ELSIF NEW.state = 'FAILED' AND NEW.error_code = 'ACCESS_REVOKED' THEN
        PERFORM pause_export_schedule(NEW.schedule_id, 'ACCESS_REVOKED');
    ELSIF OLD.state = 'FAILED_REPAIR' THEN
        UPDATE export_schedules SET state = 'ACTIVE', paused_reason = NULL, next_run_at = now(),
            version = version + 1, updated_at = now()
         WHERE schedule_id = NEW.schedule_id AND paused_reason = 'RUN_NEEDS_REPAIR'
           AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.schedule_id = NEW.schedule_id
                             AND o.state = 'FAILED_REPAIR' AND o.operation_id <> NEW.operation_id);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER schedule_run_changed AFTER UPDATE OF state ON operations FOR EACH ROW
    WHEN (NEW.schedule_id IS NOT NULL AND NEW.state IS DISTINCT FROM OLD.state)
    EXECUTE FUNCTION schedule_run_changed();

-- Create a schedule (docs/schedules.md: The resource): the submit's checks in the submit's order, in one round
-- trip, and in the same key space: membership, the per-user lock, the Idempotency-Key (a key stored for an
-- export has another fingerprint, so it is 'reused' here), then the per-user limit ('quota').
CREATE FUNCTION create_export_schedule(
    p_schedule_id text, p_owner_id text, p_conversation_id text, p_idempotency_key text, p_fingerprint text,
    p_replay_window_seconds float8, p_max_schedules integer, p_every text, p_start_at timestamptz, p_mode text,
    p_request jsonb, OUT outcome submit_outcome, OUT schedule_id text)
LANGUAGE plpgsql AS $$
DECLARE
    earlier record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conversation_members m
                   WHERE m.conversation_id = p_conversation_id AND m.user_id = p_owner_id) THEN
        outcome := 'not_member';
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('submit:' || p_owner_id, 0));
    SELECT k.fingerprint, k.schedule_id,
           k.created_at + make_interval(secs => p_replay_window_seconds) <= now() AS expired
      INTO earlier FROM idempotency_keys k
     WHERE k.owner_id = p_owner_id AND k.idempotency_key = p_idempotency_key;
    IF FOUND THEN
        schedule_id := earlier.schedule_id;
        outcome := CASE WHEN earlier.fingerprint <> p_fingerprint OR earlier.schedule_id IS NULL THEN 'reused'
                        WHEN earlier.expired THEN 'expired' ELSE 'replayed' END;
        RETURN;
    END IF;
    IF (SELECT count(*) FROM export_schedules s WHERE s.owner_id = p_owner_id) >= p_max_schedules THEN
        outcome := 'quota';
        RETURN;
    END IF;
    INSERT INTO export_schedules (schedule_id, owner_id, conversation_id, every, start_at, mode, request,
                                  next_run_at, watermark)
    VALUES (p_schedule_id, p_owner_id, p_conversation_id, p_every, coalesce(p_start_at, now()), p_mode, p_request,
            coalesce(p_start_at, now()), coalesce((p_request->>'after_seq')::bigint, 0));
    INSERT INTO idempotency_keys (owner_id, idempotency_key, fingerprint, schedule_id)
    VALUES (p_owner_id, p_idempotency_key, p_fingerprint, p_schedule_id);
    schedule_id := p_schedule_id;
    outcome := 'created';
END;
$$;
