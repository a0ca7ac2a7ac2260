"""The database's repositories: one module per table (or per tightly bound group of tables), the only code
that writes it (docs/architecture.md: How it works, Layout).

- the ``operations`` table, split by who calls it: ``status_monitor`` (the API's reads, the owner's cancel,
  the admin's requeue), ``leases`` (the worker's claim, heartbeat, progress and every end of an attempt,
  fenced by the generation) and ``sweeps`` (the janitor's expiry, wake-ups, abandoned cancellations, purge
  and gauges);
- ``attempts``: one row per claim; ``artifacts``: the record of every object an attempt writes;
- ``access_events``: who fetched or removed a result;
- ``submissions``: a submit, which creates an operation with its idempotency key (``idempotency_keys``)
  and its first wake-up, in one server-side function;
- ``outbox``: wake-ups waiting for the relay;
- ``message_store``: conversations, their members and their messages as the API and the admin write and
  read them; ``export_reader``: the messages an export attempt reads, range by range.

A statement may read another table to decide (a fenced insert checks the operation's generation), never
write it. Every function takes the caller's connection, so that writes of several tables share one
transaction.
"""
