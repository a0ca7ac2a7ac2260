-- The plain-text format txt (README: API reference, Export options). The formats are the registry of
-- shared/formats.py; this constraint follows it, and a test compares the two. One statement, so the
-- constraint is never missing; the previous release never writes txt, so it runs on beside this one while
-- a deploy rolls (README: Rolling deploys).
ALTER TABLE operations
    DROP CONSTRAINT operations_format,
    ADD CONSTRAINT operations_format CHECK (format IN ('jsonl', 'csv', 'html', 'txt'));
