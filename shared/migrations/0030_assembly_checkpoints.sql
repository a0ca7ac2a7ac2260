-- step: pre
-- Where a chunked export's assembly stands (docs/chunks.md: Chunked exports, A coordinator's takeover): after each
-- part that leaves nothing pending, the coordinator records the upload, its parts, the next byte's place and the
-- saved states of the SHA-256s in its artifact's record, so that a coordinator that takes over resumes there
-- instead of reading every chunk again. NULL for every other artifact; the previous release neither writes nor
-- reads it.

ALTER TABLE artifacts ADD COLUMN assembly jsonb;
