-- A callback is claimed with a lease, then sent with no transaction open, then recorded (docs/api.md: API
-- reference, Completion callbacks): the claim moves next_attempt_at past one attempt's deadline, so a relay
-- that dies while sending leaves the delivery due again once the lease ends, and bumps the delivery's fencing
-- generation, so that the record of a relay whose lease ran out (another relay has claimed the delivery since)
-- changes nothing. Until now the claim's row locks were held across the HTTP requests.
ALTER TABLE webhook_deliveries ADD COLUMN generation bigint NOT NULL DEFAULT 0;
