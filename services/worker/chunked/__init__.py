"""A chunked export (docs/chunks.md: Chunked exports): the coordinator that plans and assembles, one chunk's
deliveries and runner, and the assembly of the finished chunks into one file."""
