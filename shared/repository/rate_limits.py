"""Each user's rate-limit windows and storage budget (docs/api.md: Rate limits): the SQL of ``rate_limit_windows``
(migration 0028). A submit's take happens inside the submit's own statement (``shared.repository.submissions``);
polls and downloads take a batch at a time here for a process's local share (``services.api.limiting``).
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from shared.states import ACTIVE

_ACTIVE_STATES = sorted(state.value for state in ACTIVE)


@dataclass(frozen=True)
class Allowance:
    """What one take from a window gave: ``granted`` units (0 when the window is spent), ``remaining`` units
    left in the window after it, and ``reset_seconds`` until the window ends, on the database's clock.
    """

    granted: int
    remaining: int
    reset_seconds: float


async def take_allowance(
    conn: asyncpg.Connection, *, user_id: str, policy: str, quota: int, window_seconds: int, wanted: int
) -> Allowance:
    """Take up to ``wanted`` units of ``user_id``'s window of ``policy`` (``quota`` units per ``window_seconds``,
    windows aligned on the database's clock); ``wanted`` 0 only reads it, without a write or a lock. One round
    trip, atomic under the window's row lock: any number of processes taking at once never grant more than
    ``quota`` in a window, and a window never moves back. Commits with the caller's
    transaction, or at once without one. Raises what asyncpg raises (a timeout, a lost connection).
    """
    row = await conn.fetchrow(
        "SELECT granted, remaining, reset_seconds FROM take_allowance_v1($1, $2, $3, $4, $5)",
        user_id,
        policy,
        quota,
        window_seconds,
        wanted,
    )
    assert row is not None
    return Allowance(row["granted"], row["remaining"], max(0.0, row["reset_seconds"]))


@dataclass(frozen=True)
class Holdings:
    """What a user holds: ``content_bytes`` (results not yet expired, and what exports being written have
    written), the seconds until the first of those results expires (None when none has a result), and the
    ``active_exports`` not yet ended."""

    content_bytes: int
    next_expiry_seconds: float | None
    active_exports: int


async def holdings(conn: asyncpg.Connection, *, user_id: str) -> Holdings:
    """What ``user_id`` holds against the storage budget and the active-export quota, as a submit checks them."""
    row = await conn.fetchrow(
        "SELECT used_bytes, next_expiry_seconds, active_count FROM content_bytes_used_v1($1, $2)",
        user_id,
        _ACTIVE_STATES,
    )
    assert row is not None
    return Holdings(row["used_bytes"], row["next_expiry_seconds"], row["active_count"])
