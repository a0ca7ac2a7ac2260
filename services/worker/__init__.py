"""The export worker: claims operations with a lease and streams their messages into S3."""
