-- step: pre
-- A small export's worker in three round trips (docs/benchmark.md: Three round trips per export): the claim,
-- the read, the SUCCEEDED commit. Two statements of their own are folded into the functions that already run.
--
-- claim_export_v3 is claim_export_v2 (migration 0026) that, when it claims, also records the new generation's
-- artifact WRITING under its key, so the record still comes before the first byte (docs/architecture.md:
-- How it works). The worker passes the key's pieces, which it derives from the one place that makes keys:
-- p_key_stem (the operation's folder and "g"), and p_suffixes, the suffix of each format, compression and
-- media ("jsonl/none/0" -> ".jsonl"); a split result's key is a folder ("/").
--
-- succeed_export_v2 is succeed_export (migration 0017) whose artifact step also takes the lease's own record
-- straight from WRITING to PUBLISHED with its figures: a file written in one PutObject is not recorded COMPLETE
-- first, since rewriting it after an unknown outcome costs less than that round trip on every export. An
-- adopted earlier generation's record goes COMPLETE -> PUBLISHED as before, and the claim's record of the
-- adopting generation, which wrote nothing, goes to DELETED in the same statement.
--
-- The previous release calls claim_export_v2 and succeed_export, which stay as they were: its worker records
-- and completes the artifact with statements of its own.

CREATE FUNCTION claim_export_v3(p_operation_id text, p_worker_id text, p_lease_seconds float8,
                             p_max_attempts integer, p_lost_message text, p_key_stem text, p_suffixes jsonb,
                             OUT parked boolean, OUT took_over boolean, OUT member boolean,
                             OUT claimed operations, OUT artifact_key text)
LANGUAGE plpgsql AS $$
DECLARE
    claim record;
BEGIN
    SELECT * INTO claim FROM claim_export_v2(p_operation_id, p_worker_id, p_lease_seconds, p_max_attempts,
                                             p_lost_message);
    parked := claim.parked;
    took_over := claim.took_over;
    member := claim.member;
    claimed := claim.claimed;
    IF claimed.operation_id IS NOT NULL THEN
        artifact_key := p_key_stem || claimed.generation || CASE
            WHEN claimed.max_part_bytes IS NOT NULL THEN '/'
            ELSE p_suffixes ->> concat_ws('/', claimed.format, claimed.compression,
                                          coalesce(claimed.media, false)::int)
        END;
        INSERT INTO artifacts (operation_id, generation, object_key, state)
        VALUES (p_operation_id, claimed.generation, artifact_key, 'WRITING');
    END IF;
END;
$$;

-- p_artifact_generation's record to PUBLISHED with the result's figures: a COMPLETE one, or the lease's own
-- (p_generation) still WRITING; the claim's record of an adopting generation to DELETED. False when the
-- record moved on (removed meanwhile), with nothing written.
CREATE FUNCTION publish_artifact_v2(p_operation_id text, p_artifact_generation bigint, p_generation bigint,
                                    p_size_bytes bigint, p_sha256 text, p_message_count bigint, p_parts jsonb)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE artifacts SET state = 'PUBLISHED', size_bytes = p_size_bytes, sha256 = p_sha256,
        message_count = p_message_count, parts = p_parts, updated_at = now()
    WHERE operation_id = p_operation_id AND generation = p_artifact_generation
      AND (state = 'COMPLETE' OR (state = 'WRITING' AND generation = p_generation));
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_artifact_generation <> p_generation THEN
        UPDATE artifacts SET state = 'DELETED', updated_at = now()
        WHERE operation_id = p_operation_id AND generation = p_generation AND state = 'WRITING';
    END IF;
    RETURN true;
END;
$$;

CREATE FUNCTION succeed_export_v2(p_conversation_id text, p_owner_id text, p_artifact_generation bigint,
                                  p_operation_id text, p_generation bigint, p_key text, p_size_bytes bigint,
                                  p_sha256 text, p_message_count bigint, p_parts jsonb, p_ttl_seconds float8,
                                  p_bytes_written bigint)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF NOT member_locked(p_conversation_id, p_owner_id) THEN
        RETURN 'not_member';
    END IF;
    BEGIN
        IF NOT succeed_lease(p_operation_id, p_generation, p_key, p_size_bytes, p_sha256, p_message_count,
                             p_parts, p_ttl_seconds, p_bytes_written) THEN
            RETURN 'lease_lost';
        END IF;
        IF NOT publish_artifact_v2(p_operation_id, p_artifact_generation, p_generation, p_bytes_written,
                                   p_sha256, p_message_count, p_parts) THEN
            RAISE EXCEPTION USING ERRCODE = 'CX001';
        END IF;
    EXCEPTION WHEN SQLSTATE 'CX001' THEN
        RETURN 'artifact_gone';
    END;
    RETURN 'succeeded';
END;
$$;
