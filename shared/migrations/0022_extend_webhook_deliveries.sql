-- step: pre
-- A batch of completion callbacks keeps its lease by the heartbeat every other lease uses (docs/architecture.md:
-- Leases and fencing): the relay extends the deliveries it still sends, under the generation it claimed them
-- with. The previous release claims and records as before and needs nothing of this migration.

-- Extends the lease of each delivery whose id, generation and attempts (as claimed) are the n-th elements of
-- the arrays, to p_lease_seconds from now (database clock): one whose attempt was recorded since (attempts
-- moved on) or that was claimed again (another generation) keeps its time. The number extended: 0 once every
-- attempt of the batch is recorded.
CREATE FUNCTION extend_webhook_deliveries_v1(
    p_delivery_ids bigint[], p_generations bigint[], p_attempts integer[], p_lease_seconds float8)
RETURNS integer LANGUAGE sql AS $$
    WITH extended AS (
        UPDATE webhook_deliveries d SET next_attempt_at = now() + make_interval(secs => p_lease_seconds)
          FROM unnest(p_delivery_ids, p_generations, p_attempts) AS held(delivery_id, generation, attempts)
         WHERE d.delivery_id = held.delivery_id AND d.generation = held.generation AND d.attempts = held.attempts
        RETURNING 1
    )
    SELECT count(*)::integer FROM extended;
$$;
