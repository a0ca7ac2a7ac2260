"""Postgres connection pools and the migration runner.

Migrations are the numbered ``shared/migrations/NNNN_name.sql`` files, each applied once in its own
transaction and recorded in ``schema_migrations``. A session advisory lock makes concurrent runs safe: the
second waits, then finds nothing left to apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from shared.lifecycle import keep_trying
from shared.settings import DATABASE_CONNECT_TIMEOUT_SECONDS, DatabaseSettings

log = logging.getLogger(__name__)


class ReadOnlyServer(Exception):
    """The session's server takes no writes: a standby, or a primary that was demoted or made read-only
    (docs/deploy.md: A primary with standbys).
    """


class UnreplicatedCommit(Exception):
    """A COMMIT whose wait for a synchronous standby was cancelled: it holds on this server only, and a
    failover may lose it, so nothing may acknowledge it (docs/deploy.md: A primary with standbys).
    """


# What a lost, unreachable, restarting or overloaded database raises: callers retry later instead of
# failing the work. Class 57 (operator intervention) covers admin shutdown, "cannot connect now" and
# statement timeouts. A connection whose server went away mid-statement can also be left with the driver
# in a broken state ("cannot switch to state 15; another operation is in progress"): InternalClientError.
# A server that refuses new connections for a while answers "too many clients" (53300) or "database is not
# accepting connections" (55000, whose class also holds "lock not available"): both pass. During a failover
# a session lands on a server that takes no writes (25006, ``ReadOnlyServer``; no host taking writes yet is
# asyncpg's ``TargetServerAttributeNotMatched``, an ``InternalClientError``), and a commit may hold on the
# old primary only (``UnreplicatedCommit``): all pass once a primary takes over.
TRANSIENT_DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.OperatorInterventionError,
    asyncpg.TooManyConnectionsError,
    asyncpg.ObjectNotInPrerequisiteStateError,
    asyncpg.ReadOnlySQLTransactionError,
    ReadOnlyServer,
    UnreplicatedCommit,
)

# The start of the WARNING a primary sends when a COMMIT's wait for a synchronous standby was cancelled
# (PostgreSQL's syncrep.c; English server messages, ``lc_messages``, are assumed): the commit then reports
# success although it holds on this server only.
SYNC_REP_CANCELLED = "canceling wait for synchronous replication"
# Set on every pooled session. JIT compilation is off: Postgres compiles a statement at each execution whose
# estimated cost passes ``jit_above_cost``, and the export read's estimate counts the per-row subplans (edits,
# replies, attachments) that almost never run, so a part-sized range paid about 0.75 s of compilation for
# 0.2 s of work (docs/benchmark.md: The read of an export's lines). Every pooled statement is short.
POOL_SESSION_PARAMETERS = {"jit": "off"}


def split_hosts(dsn: str) -> list[tuple[str, str]]:
    """``[(host, dsn_of_that_host), ...]`` for a ``postgresql://user@h1:p1,h2:p2/db?...`` URL, in the URL's
    order; each single-host URL keeps the user, database and parameters (``target_session_attrs`` too). A
    single-host URL comes back alone, unchanged. Hosts are ``name``, ``name:port`` or ``[v6]:port``.
    """
    parts = urlsplit(dsn)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return [(hosts, dsn)]
    return [(host, urlunsplit(parts._replace(netloc=f"{userinfo}{at}{host}"))) for host in hosts.split(",")]


async def open_connection(
    dsn: str,
    *,
    connect_timeout_seconds: float = DATABASE_CONNECT_TIMEOUT_SECONDS,
    pool: asyncpg.Pool | None = None,
    writable: bool = False,
    **kwargs: Any,
) -> asyncpg.Connection:
    """The first connection, host by host in the order of ``dsn`` (``split_hosts``), that satisfies its
    ``target_session_attrs`` and, with ``writable``, whose server takes writes (``require_writable``): a URL
    that names a standby, or a primary made read-only, without ``target_session_attrs=read-write`` would
    otherwise give sessions whose every write fails (docs/operations.md: A database that takes no writes).
    Each attempt has its own ``connect_timeout_seconds`` (s), so a black-holed host costs one timeout, not the
    whole connect (asyncpg gives one timeout to all hosts).
    ``kwargs`` go to ``asyncpg.connect``; ``pool`` is the pool the connection will serve, if any.

    The connection discards itself on its first "read-only" error (25006): a standby or a demoted primary
    never becomes writable under an open session, so it is terminated, or, in ``pool``, closed on release
    with every other connection of the pool, rather than retried; the next connection finds the primary.
    Raises the last host's error (``OSError``, ``TimeoutError``, ``asyncpg.TargetServerAttributeNotMatched``,
    ``asyncpg.PostgresError``, ``ReadOnlyServer``).
    """
    last_error: BaseException | None = None
    for host, host_dsn in split_hosts(dsn):
        try:
            conn = await asyncpg.connect(host_dsn, timeout=connect_timeout_seconds, **kwargs)
            if writable:
                await _writable_or_closed(conn, connect_timeout_seconds)
        except (*TRANSIENT_DATABASE_ERRORS, asyncpg.PostgresError) as exc:
            log.info("database host refused", extra={"host": host, "error": type(exc).__name__})
            last_error = exc
            continue
        conn.add_query_logger(functools.partial(_discard_if_read_only, conn, pool))
        return conn
    assert last_error is not None
    raise last_error


async def _writable_or_closed(conn: asyncpg.Connection, timeout_seconds: float) -> None:
    """``require_writable`` on a new connection within ``timeout_seconds`` (s); the connection is dropped
    when it fails, whatever the reason.
    """
    try:
        async with asyncio.timeout(timeout_seconds):
            await require_writable(conn)
    except BaseException:
        conn.terminate()
        raise


async def _discard_if_read_only(
    conn: asyncpg.Connection, pool: asyncpg.Pool | None, query: asyncpg.LoggedQuery
) -> None:
    if not isinstance(query.exception, asyncpg.ReadOnlySQLTransactionError) or conn.is_closed():
        return
    log.warning("database session on a read-only server discarded", extra={"host": str(query.conn_addr)})
    if pool is None:
        conn.terminate()
    else:
        # Terminating a pooled connection races with its release (asyncpg then raises InternalClientError
        # from the release); an expired connection is closed when it is released, as are its siblings.
        await pool.expire_connections()


async def create_pool(
    settings: DatabaseSettings, *, min_size: int = 1, refuse_unreplicated: bool = False, writable: bool = True
) -> asyncpg.Pool:
    """Open a pool to ``settings.database_url`` through ``open_connection``; statements time out after
    ``database_timeout_seconds``. With ``refuse_unreplicated`` (a pool whose commits are acknowledged to
    clients), handing back a connection that saw an unreplicated commit raises ``UnreplicatedCommit``.
    With ``writable`` (every pool but one that only reads), each new connection is opened on a host that
    takes writes, checked as it connects: a multi-host pool's connections may sit on different hosts.

    Raises what ``open_connection`` raises when the database cannot be reached.
    """
    pool_class = AcknowledgingPool if refuse_unreplicated else asyncpg.Pool
    pool: asyncpg.Pool = pool_class(
        settings.database_url,
        connect=lambda dsn, **kwargs: open_connection(
            dsn,
            connect_timeout_seconds=settings.database_connect_timeout_seconds,
            pool=pool,
            writable=writable,
            **kwargs,
        ),
        server_settings=POOL_SESSION_PARAMETERS,
        min_size=min_size,
        max_size=settings.database_pool_max,
        command_timeout=settings.database_timeout_seconds,
        reset=_keep_session,
        # The pool class takes explicitly what ``asyncpg.create_pool`` defaults.
        max_queries=50_000,
        max_inactive_connection_lifetime=300.0,
        loop=None,
        connection_class=asyncpg.Connection,
        record_class=asyncpg.Record,
    )
    await pool
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


class AcknowledgingPool(asyncpg.Pool):
    """A pool whose commits are acknowledged to clients: ``release`` raises ``UnreplicatedCommit`` (once the
    connection is back in the pool) when the server warned, while the connection was out, that a commit's
    wait for the synchronous standbys was cancelled: that commit holds on the primary only.

    The warning is heard by a log listener added at each acquire and removed before the release, since
    asyncpg drops log listeners on release and warns about any left.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, setup=self._listen, **kwargs)
        self._unreplicated: set[object] = set()

    async def _listen(self, conn: asyncpg.pool.PoolConnectionProxy) -> None:
        conn.add_log_listener(self._note)

    def _note(self, conn: object, message: asyncpg.PostgresLogMessage) -> None:
        # The WARNING comes before the commit's result: the statement returns with the note already taken.
        if message.message.startswith(SYNC_REP_CANCELLED):
            log.warning("commit not replicated to the synchronous standby")
            self._unreplicated.add(conn)

    async def release(self, connection: Any, *, timeout: float | None = None) -> None:  # noqa: ASYNC109 (asyncpg's signature)
        """``asyncpg.Pool.release``, then raise ``UnreplicatedCommit`` if ``connection`` saw such a commit."""
        # A connection that was terminated went back to the pool already, without its listeners.
        with contextlib.suppress(asyncpg.InterfaceError):
            connection.remove_log_listener(self._note)
        unreplicated = connection in self._unreplicated
        self._unreplicated.discard(connection)
        await super().release(connection, timeout=timeout)
        if unreplicated:
            raise UnreplicatedCommit("a commit holds on the primary only")


async def connect(settings: DatabaseSettings, *, writable: bool = False, **server_settings: str) -> asyncpg.Connection:
    """One connection of its own, outside the pool, with the pool's timeouts: for a session that holds
    state (LISTEN, an advisory lock) or a one-off command; with ``writable``, on a server that takes writes
    (``open_connection``). ``server_settings`` are Postgres parameters set for the session (e.g.
    ``idle_session_timeout``). Raises what ``open_connection`` raises.
    """
    return await open_connection(
        settings.database_url,
        connect_timeout_seconds=settings.database_connect_timeout_seconds,
        writable=writable,
        command_timeout=settings.database_timeout_seconds,
        server_settings=server_settings or None,
    )


async def await_replication(conn: asyncpg.Connection) -> None:
    """Make ``conn``'s transaction (or, outside one, this statement) commit through the synchronous standbys,
    though it changes no row: a commit that wrote no WAL does not wait for them (a transaction id alone does
    not make it), so an answer built on rows committed earlier (an idempotent replay) could acknowledge rows
    held on the primary only. A transactional logical message (prefix ``chatexport``, empty, ignored by
    everything but logical decoding) is WAL, so the commit waits until the standbys hold everything up to
    it; a cancelled wait is then seen as for any write (``UnreplicatedCommit`` from an ``AcknowledgingPool``).
    Costs one small WAL record (docs/deploy.md: A primary with standbys).
    """
    await conn.execute("SELECT pg_logical_emit_message(true, 'chatexport', '')")


async def require_writable(conn: asyncpg.Connection) -> None:
    """Raise ``ReadOnlyServer`` unless ``conn``'s server takes writes now. A standby accepts reads, session
    advisory locks and ``SELECT 1`` alike, so a session that must be on the primary (the janitor's leader
    lock, a part's readiness, a new pooled connection) asks. Asked in a transaction of its own (``atomic``),
    unless the caller has one open, so that ``transaction_read_only`` is what a writing transaction would
    get (``default_transaction_read_only``). Raises the driver's error when the session is gone.
    """
    async with atomic(conn):
        if await conn.fetchval("SELECT pg_is_in_recovery()"):
            raise ReadOnlyServer("the server is a standby")
        if await conn.fetchval("SELECT current_setting('transaction_read_only')::boolean"):
            raise ReadOnlyServer("the server takes no writes (default_transaction_read_only)")


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


async def create_pool_when_ready(settings: DatabaseSettings, *, stop: asyncio.Event) -> asyncpg.Pool:
    """``create_pool``, retried with backoff while the database is unreachable; raises ``Stopped`` on
    ``stop``.
    """
    return await keep_trying(
        lambda: create_pool(settings), what="database", errors=TRANSIENT_DATABASE_ERRORS, stop=stop
    )


async def ensure_database(
    database_url: str, *, connect_timeout_seconds: float = DATABASE_CONNECT_TIMEOUT_SECONDS
) -> bool:
    """Create the database named in ``database_url`` if it is missing; return True when it was created.

    Connects to the server's ``postgres`` database for that (the first host that satisfies the URL's
    ``target_session_attrs``, as ``open_connection``). Raises ``asyncpg.PostgresError`` on refusal.
    """
    parts = urlsplit(database_url)
    name = parts.path.lstrip("/")
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    conn = await open_connection(admin_url, connect_timeout_seconds=connect_timeout_seconds)
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


def atomic(conn: asyncpg.Connection) -> contextlib.AbstractAsyncContextManager[Any]:
    """A transaction on ``conn`` for a repository function's statements, or, when the caller has one open,
    nothing: they join it. A savepoint would cost two round trips and guard nothing, since no caller goes on
    with its transaction after a repository function raised (docs/benchmark.md: Benchmark, Counts).
    """
    return contextlib.nullcontext() if conn.is_in_transaction() else conn.transaction()
