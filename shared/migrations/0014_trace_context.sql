-- The trace context of an operation and of a schedule (docs/monitoring.md: Monitoring, Traces): the W3C traceparent
-- of the span that created it, NULL when tracing was off. Every part that wakes the operation (the relay
-- publishing any of its outbox rows, a callback about it) continues that trace, whoever wrote the wake-up.
-- Not a field of the representation: the version trigger of migration 0005 does not look at it.
ALTER TABLE operations ADD COLUMN traceparent text;
ALTER TABLE export_schedules ADD COLUMN traceparent text;
