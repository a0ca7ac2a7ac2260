"""The database's repositories: one module per table (or per tightly bound group of tables), the only code
that writes it (README: How it works, Layout).

- ``operations``: the operation and every transition of its state machine;
- ``attempts``: one row per claim; ``artifacts``: the record of every object an attempt writes;
- ``access_events``: who fetched or removed a result;
- ``submissions``: a submit, which creates an operation with its idempotency key (``idempotency_keys``)
  and its first wake-up, in one server-side function;
- ``outbox``: wake-ups waiting for the relay;
- ``conversations``: conversations, their members and their messages.

A statement may read another table to decide (a fenced insert checks the operation's generation), never
write it. Every function takes the caller's connection, so that writes of several tables share one
transaction.
"""
