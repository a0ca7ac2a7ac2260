"""Migrations: their steps, applying them, and the range of schemas a release runs on (docs/deploy.md: Upgrading).

A migration is ``shared/migrations/NNNN_name.sql``. Its first comment lines say how it runs:

- ``-- step: pre`` (additive: new tables, nullable columns or columns with a default, new function versions,
  indexes built ``CONCURRENTLY``, constraints added ``NOT VALID``), applied before the release that needs it
  rolls out, or ``-- step: post`` (what removes or tightens: drops, ``VALIDATE``, ``SET NOT NULL``), applied
  once no part of the previous release runs.
- ``-- needed: before start`` (post migrations only) marks a removal that the release shipping it needs before
  any of its parts starts: that release cannot run beside the previous one (docs/deploy.md: Upgrading, A
  release that cannot run beside the previous one).
- ``-- transaction: none`` runs it outside a transaction, one statement at a time (statements end with ``;``
  at the end of a line), as ``CREATE INDEX CONCURRENTLY`` needs; each statement must be safe to run again.

Migrations up to ``LAST_UNMARKED`` predate the steps and are recorded as they are: pre, in a transaction.
Every migration runs with ``lock_timeout`` set, so one that waits for a lock fails instead of queueing every
query of the running parts behind it.

A release runs on a schema that has every pre migration it ships (and every post migration it needs before
start), and no post migration it does not know:
a later release's pre migrations only add, so they are within its range; a later post migration may remove
what it uses.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

import asyncpg

from shared.db import ensure_database, open_connection
from shared.settings import DATABASE_CONNECT_TIMEOUT_SECONDS, DatabaseSettings

log = logging.getLogger(__name__)

# Any constant works; it only has to be the same for every migrating process.
MIGRATION_LOCK_KEY = 0x63686578  # "chex"
# The last migration written before migrations had steps: it and those before it carry no marks.
LAST_UNMARKED = "0018"
LOCK_TIMEOUT = "5s"
# A migration whose locks meet a running part's in a cycle gives way (``_lose_deadlocks``) and is tried again,
# up to this many times, waiting this long times the attempt's number in between.
DEADLOCK_TIMEOUT = "100ms"
LOCK_ATTEMPTS = 10
LOCK_RETRY_SECONDS = 0.5
_MARK = re.compile(r"^--\s*(step|transaction|needed):\s*(.+?)\s*$")
NEEDED_BEFORE_START = "before start"
# A statement of a migration run outside a transaction ends with ";" at the end of a line.
_STATEMENT_END = re.compile(r";[ \t]*\n")


class Step(enum.StrEnum):
    """When a migration is applied during an upgrade (docs/deploy.md: Upgrading)."""

    PRE = "pre"
    POST = "post"


@dataclass(frozen=True)
class Migration:
    """One migration file: ``version`` is its name without ``.sql`` (``0019_outbox_payload_version``)."""

    version: str
    sql: str
    step: Step
    transactional: bool
    needed_before_start: bool = False

    @property
    def number(self) -> str:
        """The four digits that order it."""
        return self.version[:4]

    def statements(self) -> list[str]:
        """The statements of a migration run outside a transaction, in order."""
        return [part.strip() for part in _STATEMENT_END.split(self.sql + "\n") if _code(part)]


class BadMigration(ValueError):
    """A migration file's marks are missing or unknown."""


def parse(version: str, sql: str) -> Migration:
    """The migration ``version`` with text ``sql``, its step and transaction read from its leading comment
    lines. Raises ``BadMigration`` when a migration after ``LAST_UNMARKED`` has no step or a mark is unknown.
    """
    marks: dict[str, str] = {}
    for line in sql.splitlines():
        if not line.startswith("--"):
            break
        if found := _MARK.match(line):
            marks[found[1]] = found[2]
    if version[:4] <= LAST_UNMARKED and not marks:
        return Migration(version, sql, Step.PRE, transactional=True)
    try:
        step = Step(marks["step"])
    except (KeyError, ValueError):
        raise BadMigration(f"{version}: the first lines must say `-- step: pre` or `-- step: post`") from None
    transaction = marks.get("transaction", "required")
    if transaction not in ("required", "none"):
        raise BadMigration(f"{version}: `-- transaction:` takes `none` (or is left out), not {transaction!r}")
    needed = marks.get("needed")
    if needed is not None and (needed != NEEDED_BEFORE_START or step is not Step.POST):
        raise BadMigration(f"{version}: `-- needed: {NEEDED_BEFORE_START}` is the one value, on a post migration")
    return Migration(version, sql, step, transactional=transaction == "required", needed_before_start=bool(needed))


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """Every migration this release ships, ordered by version; read once per process, since every readiness
    probe checks the schema against them. Raises ``BadMigration``.
    """
    folder = resources.files("shared") / "migrations"
    found = [(entry.name.removesuffix(".sql"), entry) for entry in folder.iterdir() if entry.name.endswith(".sql")]
    return tuple(parse(version, entry.read_text("utf-8")) for version, entry in sorted(found) if version[:4].isdigit())


class SchemaOutOfRange(Exception):
    """The database's schema is outside the range this release runs on; the message says what to do."""


def check_range(applied: Mapping[str, Step], shipped: Sequence[Migration]) -> None:
    """Raise ``SchemaOutOfRange`` unless a release shipping ``shipped`` runs on a database where the
    migrations ``applied`` (version to step) ran: every pre migration it ships must have run, and every post
    migration it needs before start, and no post migration it does not ship (docs/deploy.md: Upgrading).
    """
    missing = [m.version for m in shipped if m.step is Step.PRE and m.version not in applied]
    if missing:
        raise SchemaOutOfRange(
            f"the database schema is older than this release needs: migration {missing[0]} has not run"
            f" ({len(missing)} missing); run `chatexport migrate --pre`"
        )
    needed = [m.version for m in shipped if m.needed_before_start and m.version not in applied]
    if needed:
        raise SchemaOutOfRange(
            f"this release cannot run beside the previous one: post migration {needed[0]} has not run; stop"
            " every part of the previous release, then run `chatexport migrate`"
        )
    known = {m.version for m in shipped}
    unknown = sorted(version for version, step in applied.items() if step is Step.POST and version not in known)
    if unknown:
        raise SchemaOutOfRange(
            f"the database schema is newer than this release runs on: post migration {unknown[0]} may have"
            " removed what it uses; run the release that shipped it"
        )


async def applied_migrations(conn: asyncpg.Connection) -> dict[str, Step]:
    """The migrations recorded in ``schema_migrations``, version to step; empty when nothing was migrated."""
    if not await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
        return {}
    # Read through to_jsonb: a database no release with steps has migrated yet has no step column, and a
    # part only reads.
    rows = await conn.fetch("SELECT version, coalesce(to_jsonb(m) ->> 'step', 'pre') AS step FROM schema_migrations m")
    return {row["version"]: Step(row["step"]) for row in rows}


async def check_schema(conn: asyncpg.Connection) -> None:
    """Raise ``SchemaOutOfRange`` unless this release runs on the schema of ``conn``'s database."""
    check_range(await applied_migrations(conn), migrations())


async def require_schema(pool: asyncpg.Pool) -> None:
    """At a part's start-up: raise ``SchemaOutOfRange``, logged as an error that names what to run, unless
    this release runs on the schema of ``pool``'s database. Raises what the connection raises when the
    database cannot be reached.
    """
    async with pool.acquire() as conn:
        try:
            await check_schema(conn)
        except SchemaOutOfRange as exc:
            log.error("refusing to start: %s", exc, extra={"error": type(exc).__name__})
            raise


async def _prepare_table(conn: asyncpg.Connection) -> None:
    # The step column came with the steps; a row of an earlier release reads as pre, which they all were.
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations"
        " (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());"
        " ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS step text NOT NULL DEFAULT 'pre'"
    )


async def migrate_database(
    settings: DatabaseSettings, *, steps: Collection[Step] = tuple(Step)
) -> tuple[bool, list[str]]:
    """Create the database if missing, then apply the pending migrations of ``steps``; return (created,
    versions applied by this call).

    Safe to run twice or concurrently: creation tolerates a race and migrations take an advisory lock.
    Raises ``OSError`` or ``asyncpg.PostgresError`` when the server cannot be reached or refuses, and
    ``BadMigration`` as ``migrate`` does.
    """
    timeout = settings.database_connect_timeout_seconds
    created = await ensure_database(settings.database_url, connect_timeout_seconds=timeout)
    return created, await migrate(settings.database_url, connect_timeout_seconds=timeout, steps=steps)


async def migrate(
    database_url: str,
    *,
    connect_timeout_seconds: float = DATABASE_CONNECT_TIMEOUT_SECONDS,
    steps: Collection[Step] = tuple(Step),
) -> list[str]:
    """Apply every pending migration of ``steps`` (both by default: all, in version order) on the first host
    of ``database_url`` that satisfies its ``target_session_attrs`` (``open_connection``); return the
    versions applied by this call (possibly none).

    Raises ``BadMigration`` when the post step alone is asked for while a pre migration before a pending post
    migration has not run (the pre step goes first), and ``asyncpg.PostgresError`` when a migration fails
    (it is then not recorded; one run outside a transaction may have run some of its statements).
    """
    conn = await open_connection(database_url, connect_timeout_seconds=connect_timeout_seconds)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        try:
            return await _apply_pending(conn, set(steps))
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    finally:
        await conn.close()


async def _apply_pending(conn: asyncpg.Connection, steps: set[Step]) -> list[str]:
    await _prepare_table(conn)
    done = await applied_migrations(conn)
    pending = [m for m in migrations() if m.version not in done]
    if Step.PRE not in steps:
        for migration in pending:
            if migration.step is Step.POST:
                before = [m.version for m in pending if m.step is Step.PRE and m.number < migration.number]
                if before:
                    raise BadMigration(f"run the pre step first: {before[0]} comes before {migration.version}")
    applied = []
    for migration in pending:
        if migration.step not in steps:
            continue
        await _apply(conn, migration)
        log.info("migration applied", extra={"version": migration.version, "step": str(migration.step)})
        applied.append(migration.version)
    return applied


async def _apply(conn: asyncpg.Connection, migration: Migration) -> None:
    record = "INSERT INTO schema_migrations (version, step) VALUES ($1, $2)"
    if migration.transactional:
        for attempt in range(1, LOCK_ATTEMPTS + 1):
            try:
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                    await _lose_deadlocks(conn)
                    await conn.execute(migration.sql)
                    await conn.execute(record, migration.version, str(migration.step))
                return
            except (asyncpg.DeadlockDetectedError, asyncpg.LockNotAvailableError):
                if attempt == LOCK_ATTEMPTS:
                    raise
                log.warning(
                    "migration gave way to the running parts; trying again", extra={"version": migration.version}
                )
                await asyncio.sleep(LOCK_RETRY_SECONDS * attempt)
    await conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
    try:
        for statement in migration.statements():
            await conn.execute(statement)
        await conn.execute(record, migration.version, str(migration.step))
    finally:
        await conn.execute("RESET lock_timeout")


async def _lose_deadlocks(conn: asyncpg.Connection) -> None:
    """Make this transaction the one Postgres cancels when its locks and a running part's wait for each other:
    the deadlock check runs first in the session that waits the shortest ``deadlock_timeout``, and cancels that
    session's transaction, so the migration gives way and is tried again rather than failing a part's request.
    Setting it needs a superuser; without one the default stays.
    """
    try:
        async with conn.transaction():
            await conn.execute(f"SET LOCAL deadlock_timeout = '{DEADLOCK_TIMEOUT}'")
    except asyncpg.InsufficientPrivilegeError:
        return


def _code(text: str) -> bool:
    """Whether ``text`` holds anything but comments and blank lines."""
    return any(line.strip() and not line.strip().startswith("--") for line in text.splitlines())
