-- step: pre
-- Payload versions (docs/deploy.md: Upgrading): every outbox row carries the version of its payload. The
-- previous release's inserts and the SQL functions that insert rows leave it to the default, 1, the version
-- of the payload they write. A row of a version no relay of this release reads is put back; past the
-- delivery limit it is dead-lettered: dead_lettered_at is set and not_before moved to 'infinity', so that no
-- relay of any release claims it again.
ALTER TABLE outbox ADD COLUMN payload_version integer NOT NULL DEFAULT 1;
ALTER TABLE outbox ADD COLUMN dead_lettered_at timestamptz;
