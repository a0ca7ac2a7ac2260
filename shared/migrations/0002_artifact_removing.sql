-- REMOVING: an artifact whose object is being deleted from S3. The state commits before S3 is touched,
-- so neither an adoption (which needs COMPLETE) nor the old holder (which needs WRITING) can take the
-- object back while it goes, and no transaction stays open across the S3 calls; a removal that died
-- halfway is finished by the janitor, which treats REMOVING like any artifact not yet DELETED.
ALTER TABLE artifacts DROP CONSTRAINT artifacts_state_check;
ALTER TABLE artifacts ADD CONSTRAINT artifacts_state_check
    CHECK (state IN ('WRITING', 'COMPLETE', 'PUBLISHED', 'REMOVING', 'DELETED'));
