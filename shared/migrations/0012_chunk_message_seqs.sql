-- The seqs of a finished chunk's first and last message (docs/chunks.md: Split results): a split export's
-- chunk is one part of the result, and a part names the seqs it holds. Null until DONE, and for a chunk
-- whose range holds no selected message. The previous release never reads them.
ALTER TABLE export_chunks ADD COLUMN first_message_seq bigint, ADD COLUMN last_message_seq bigint;
