"""One export operation under its lease: its deliveries, the runner that ends every attempt, and the job
that adopts an earlier file or writes it, in one stream or in chunks once the plan says so."""
