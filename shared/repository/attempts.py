"""The ``attempts`` table: one row per claim of an operation, opened in the claim's transaction and closed
in the transaction of the write that ended it (docs/states.md: Attempts). Its writes are the SQL functions
of the same names (migration 0017), which the claim's and the SUCCEEDED commit's functions call too.
"""

from __future__ import annotations

import asyncpg


async def supersede_attempts(conn: asyncpg.Connection, *, operation_id: str, generation: int) -> bool:
    """Close as LEASE_LOST every attempt of a generation below ``generation`` still open: its holder can no
    longer end it, every write of its generation being fenced off. Returns True when it closed one (the
    claim that moved to ``generation`` was a takeover). Run it in that claim's transaction.
    """
    closed: bool = await conn.fetchval("SELECT supersede_attempts($1, $2)", operation_id, generation)
    return closed


async def open_attempt(
    conn: asyncpg.Connection, *, operation_id: str, generation: int, attempt: int, worker_id: str
) -> None:
    """Record the attempt of ``generation`` (``attempt``, 1-based) held by ``worker_id``, in its claim's
    transaction (docs/states.md: Attempts).
    """
    await conn.execute(
        "SELECT open_attempt($1, $2, $3, $4)",
        operation_id,
        generation,
        attempt,
        worker_id,
    )


async def close_attempt(
    conn: asyncpg.Connection, *, operation_id: str, generation: int, outcome: str, error_code: str | None = None
) -> None:
    """Close the open attempt of ``generation`` with ``outcome`` (a state it ended in, ``HANDED_BACK`` or
    ``LEASE_LOST``) and ``error_code``; an attempt already closed, or none, is left as it is. Run it in the
    transaction of the write that ended the attempt, so that the history ends with it (docs/states.md: Attempts).
    """
    await conn.execute(
        "SELECT close_attempt($1, $2, $3, $4)",
        operation_id,
        generation,
        outcome,
        error_code,
    )


async def close_attempt_if_matched(
    status: str,
    conn: asyncpg.Connection,
    *,
    operation_id: str,
    generation: int,
    outcome: str,
    error_code: str | None = None,
) -> bool:
    """After a fenced ``UPDATE`` of one operation whose command ``status`` tells whether it matched, close
    the attempt of ``generation`` it ended (``close_attempt``); return whether it matched.
    """
    if status != "UPDATE 1":
        return False
    await close_attempt(conn, operation_id=operation_id, generation=generation, outcome=outcome, error_code=error_code)
    return True


async def list_attempts(conn: asyncpg.Connection, *, operation_id: str) -> list[asyncpg.Record]:
    """Every recorded claim of the operation, oldest generation first: (generation, attempt, worker_id,
    claimed_at, ended_at, outcome, error_code); ``ended_at`` and ``outcome`` are NULL while it runs.
    """
    rows: list[asyncpg.Record] = await conn.fetch(
        """
        SELECT generation, attempt, worker_id, claimed_at, ended_at, outcome, error_code
        FROM attempts WHERE operation_id = $1 ORDER BY generation
        """,
        operation_id,
    )
    return rows
