"""Postgres connection pools and the migration runner.

Migrations are the numbered ``shared/migrations/NNNN_name.sql`` files, each applied once in its own
transaction and recorded in ``schema_migrations``. A session advisory lock makes concurrent runs safe: the
second waits, then finds nothing left to apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from importlib import resources
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from shared.lifecycle import keep_trying
from shared.settings import Settings

log = logging.getLogger(__name__)

# What a lost, unreachable, restarting or overloaded database raises: callers retry later instead of
# failing the work. Class 57 (operator intervention) covers admin shutdown, "cannot connect now" and
# statement timeouts. A connection whose server went away mid-statement can also be left with the driver
# in a broken state ("cannot switch to state 15; another operation is in progress"): InternalClientError.
# A server that refuses new connections for a while answers "too many clients" (53300) or "database is not
# accepting connections" (55000, whose class also holds "lock not available"): both pass.
TRANSIENT_DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.OperatorInterventionError,
    asyncpg.TooManyConnectionsError,
    asyncpg.ObjectNotInPrerequisiteStateError,
)

# Any constant works; it only has to be the same for every migrating process.
MIGRATION_LOCK_KEY = 0x63686578  # "chex"


async def ping(conn: asyncpg.Connection) -> None:
    """Run a trivial query; raises what the driver raises when the database cannot answer."""
    await conn.fetchval("SELECT 1")


async def create_pool(settings: Settings, *, min_size: int = 1) -> asyncpg.Pool:
    """Open a pool to ``settings.database_url``; statements time out after ``database_timeout_seconds``.

    Raises ``OSError`` or ``asyncpg.PostgresError`` when the database cannot be reached.
    """
    pool = await asyncpg.create_pool(
        settings.database_url,
        min_size=min_size,
        max_size=settings.database_pool_max,
        command_timeout=settings.database_timeout_seconds,
        timeout=settings.database_timeout_seconds,
        reset=_keep_session,
    )
    assert pool is not None
    return pool


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing beyond asyncpg's own client-side reset, which drops listeners and
    rolls back a transaction left open.

    asyncpg's default also sends ``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``, a round trip
    per request. Safe to skip because no pooled connection ever holds session state: advisory locks on pooled
    connections are transaction-scoped (``pg_advisory_xact_lock``), cursors live inside transactions, and
    every ``LISTEN`` or session lock (the API's change feed, the janitor's leadership, migrations) runs on a
    connection of its own (``connect``). Nothing sets a session parameter after connecting.
    """


async def connect(settings: Settings, **server_settings: str) -> asyncpg.Connection:
    """One connection of its own, outside the pool, with the pool's timeouts: for a session that holds
    state (LISTEN, an advisory lock) or a one-off command. ``server_settings`` are Postgres parameters set
    for the session (e.g. ``idle_session_timeout``). Raises what ``create_pool`` raises.
    """
    return await asyncpg.connect(
        settings.database_url,
        timeout=settings.database_timeout_seconds,
        command_timeout=settings.database_timeout_seconds,
        server_settings=server_settings or None,
    )


# How long closing a connection of its own may take a part that stops, before the connection is dropped.
CLOSE_TIMEOUT_SECONDS = 5.0


async def close_connection(conn: asyncpg.Connection, *, timeout_seconds: float = CLOSE_TIMEOUT_SECONDS) -> None:
    """Close ``conn`` (a part's own, not a pool's) within ``timeout_seconds`` (s), else terminate it. A part
    that stops must stop: a server that went away, or a process frozen past the server's patience, makes a
    graceful close time out or fail, and that is no error of the part's. Raises nothing of that kind.
    """
    if conn.is_closed():
        return
    try:
        await conn.close(timeout=timeout_seconds)
    except TRANSIENT_DATABASE_ERRORS:
        conn.terminate()


@contextlib.asynccontextmanager
async def probing_connection(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    """A pooled connection for a probe that the caller bounds with a short deadline (readiness, a scrape).

    When the probe fails or is cancelled mid-statement, the connection is terminated before it goes back:
    a graceful release would first wait, up to the statement timeout, for a hung server to confirm the
    cancel, and the probe would answer long after its deadline.
    """
    conn = await pool.acquire()
    try:
        yield conn
    except BaseException:
        conn.terminate()
        raise
    finally:
        await pool.release(conn)


async def create_pool_when_ready(settings: Settings, *, stop: asyncio.Event) -> asyncpg.Pool:
    """``create_pool``, retried with backoff while the database is unreachable; raises ``Stopped`` on
    ``stop``.
    """
    return await keep_trying(
        lambda: create_pool(settings), what="database", errors=TRANSIENT_DATABASE_ERRORS, stop=stop
    )


def migration_files() -> list[tuple[str, str]]:
    """Return ``[(version, sql), ...]`` for every migration, ordered by version."""
    folder = resources.files("shared") / "migrations"
    found = [(entry.name.removesuffix(".sql"), entry.read_text("utf-8")) for entry in folder.iterdir()]
    return sorted((item for item in found if item[0][:4].isdigit()), key=lambda item: item[0])


async def ensure_database(database_url: str) -> bool:
    """Create the database named in ``database_url`` if it is missing; return True when it was created.

    Connects to the server's ``postgres`` database for that. Raises ``asyncpg.PostgresError`` on refusal.
    """
    parts = urlsplit(database_url)
    name = parts.path.lstrip("/")
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    conn = await asyncpg.connect(admin_url)
    try:
        if await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            return False
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        except (asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
            # Another process created it between our check and our CREATE; the loser of that race may
            # fail on pg_database's unique index instead of with DuplicateDatabaseError.
            return False
        return True
    finally:
        await conn.close()


async def migrate_database(settings: Settings) -> tuple[bool, list[str]]:
    """Create the database if missing, then migrate; return (created, versions applied by this call).

    Safe to run twice or concurrently: creation tolerates a race and migrations take an advisory lock.
    Raises ``OSError`` or ``asyncpg.PostgresError`` when the server cannot be reached or refuses.
    """
    created = await ensure_database(settings.database_url)
    return created, await migrate(settings.database_url)


async def migrate(database_url: str) -> list[str]:
    """Apply every pending migration; return the versions applied by this call (possibly none)."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        try:
            return await _apply_pending(conn)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    finally:
        await conn.close()


async def _apply_pending(conn: asyncpg.Connection) -> list[str]:
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations"
        " (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
    )
    done = {row["version"] for row in await conn.fetch("SELECT version FROM schema_migrations")}
    applied = []
    for version, sql in migration_files():
        if version in done:
            continue
        async with conn.transaction():
            await conn.execute(sql)
            await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", version)
        log.info("migration applied", extra={"version": version})
        applied.append(version)
    return applied
