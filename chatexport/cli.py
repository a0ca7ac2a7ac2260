"""The ``chatexport`` command: run one part, migrate, mint a development token, import demo data, ``dev``,
requeue, and ``health`` for container healthchecks.

Every subcommand builds its settings from the ``CHATEXPORT_*`` environment: a part only the groups it uses
(``ApiPartSettings``, ...), any other command all of them (``Settings``). The parts are imported as modules,
so that the type checker checks each ``main(settings)`` against its settings; the developer tooling (``devtools``) only
by ``import`` and ``dev``, since the demo corpus and its YAML parser are an optional extra that the
production image does not carry (docs/architecture.md: How it works).

Exit codes: 0 success; 1 the command failed; 2 usage or configuration error (argparse's convention).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import asyncpg
import pydantic

from chatexport.client.arguments import positive_int, positive_seconds
from shared.db import connect, create_pool
from shared.ids import is_operation_id, is_valid_id
from shared.lifecycle import follow_parent
from shared.migrator import BadMigration, SchemaOutOfRange, Step, migrate_database
from shared.repair import Requeue, requeue
from shared.settings import (
    ApiPartSettings,
    JanitorPartSettings,
    PartSettings,
    RelayPartSettings,
    Settings,
    WorkerPartSettings,
    local_url,
)
from shared.version import VERSION

SettingsOf = TypeVar("SettingsOf", bound=PartSettings)


@dataclass(frozen=True)
class Part(Generic[SettingsOf]):
    """A long-running part: the settings it builds and the ``module`` whose ``main(settings)`` runs it until
    SIGTERM/SIGINT. The module is imported only by the process that runs the part: a worker never holds the
    api's code, nor the api the worker's (docs/benchmark.md: Memory).
    """

    settings: type[SettingsOf]
    module: str

    def main(self, settings: SettingsOf) -> None:
        """Import the part's module and run its ``main(settings)``."""
        run: Callable[[SettingsOf], None] = importlib.import_module(self.module).main
        run(settings)


PARTS: dict[str, Part[Any]] = {
    "api": Part(ApiPartSettings, "services.api.app"),
    "relay": Part(RelayPartSettings, "services.relay.main"),
    "worker": Part(WorkerPartSettings, "services.worker.main"),
    "janitor": Part(JanitorPartSettings, "services.janitor.main"),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand; each sets ``handler`` to a ``(args) -> int`` function."""
    parser = argparse.ArgumentParser(prog="chatexport", description="Asynchronous chat export service.")
    parser.add_argument("--version", action="version", version=f"chatexport {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for part in PARTS:
        sub = commands.add_parser(part, help=f"run the {part} until SIGTERM/SIGINT")
        sub.set_defaults(handler=_cmd_part, part=part)
    migrate = commands.add_parser(
        "migrate", help="create the database if missing and apply pending migrations (pre and post steps by default)"
    )
    migrate.set_defaults(handler=_cmd_migrate)
    step = migrate.add_mutually_exclusive_group()
    step.add_argument("--pre", action="store_true", help="only the pre migrations: before rolling out a release")
    step.add_argument("--post", action="store_true", help="only the post migrations: once the old release is gone")
    _add_token(commands)
    _add_import(commands)
    _add_dev(commands)
    _add_requeue(commands)
    _add_health(commands)
    # The client's code is imported with its parser only: a part's process never builds it (``main``).
    from chatexport.client import commands as client
    from chatexport.client import schedule_commands

    client.add_commands(commands)
    schedule_commands.add_commands(commands)
    return parser


def _add_token(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = commands.add_parser("token", help="print a development JWT signed with CHATEXPORT_JWT_SECRET")
    sub.add_argument("--sub", required=True, type=_user_id, help="user id (the token's sub)")
    sub.add_argument("--admin", action="store_true", help="add the admin scope")
    sub.add_argument("--ttl", type=positive_int, default=3600, metavar="SECONDS", help="lifetime (default 3600)")
    sub.set_defaults(handler=_cmd_token)


def _add_import(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = commands.add_parser("import", help="load the chatterbot corpus as demo conversations")
    which = sub.add_mutually_exclusive_group()
    which.add_argument(
        "--language", action="append", metavar="NAME", help="a corpus language; repeatable (default: all)"
    )
    which.add_argument("--all", action="store_true", help="every language of the corpus (the default)")
    sub.add_argument("--limit-files", type=positive_int, metavar="N", help="at most N files per language")
    sub.set_defaults(handler=_cmd_import)


def _add_dev(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = commands.add_parser("dev", help="run every part locally with moto and demo data (make run)")
    sub.add_argument("--workers", type=positive_int, default=2, metavar="N", help="worker processes (default 2)")
    sub.add_argument(
        "--language", action="append", metavar="NAME", help="demo corpus language; repeatable (default: all)"
    )
    sub.add_argument("--no-import", action="store_true", help="skip loading the demo corpus")
    sub.add_argument(
        "--ready-timeout",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="wait for /readyz (default 60)",
    )
    sub.set_defaults(handler=_cmd_dev)


def _add_requeue(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = commands.add_parser("requeue", help="put FAILED_REPAIR operations back to QUEUED with a fresh budget")
    sub.add_argument("operation_ids", nargs="+", type=_operation_id, metavar="OPERATION_ID")
    sub.set_defaults(handler=_cmd_requeue)


def _add_health(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = commands.add_parser(
        "health", help="exit 0 if the part on this host is ready (its monitoring port's /readyz), else 1"
    )
    sub.add_argument("--live", action="store_true", help="ask /healthz (process alive) instead of /readyz")
    sub.add_argument(
        "--url",
        type=_http_url,
        help="a part's base URL (its /readyz or /healthz is asked) or a full endpoint URL "
        "(default: 127.0.0.1, CHATEXPORT_METRICS_PORT)",
    )
    sub.add_argument(
        "--timeout", type=positive_seconds, default=5.0, metavar="SECONDS", help="give up after (default 5)"
    )
    sub.set_defaults(handler=_cmd_health)


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError("must be an http:// or https:// URL")
    return value


def _operation_id(value: str) -> str:
    if not is_operation_id(value):
        raise argparse.ArgumentTypeError("must be an operation id: 1-64 characters of [A-Za-z0-9_-]")
    return value


def _user_id(value: str) -> str:
    if not is_valid_id(value):
        raise argparse.ArgumentTypeError("must be 1-64 characters of [A-Za-z0-9_.:-]")
    return value


def load_settings() -> Settings:
    """Settings from the ``CHATEXPORT_*`` environment; raises ``pydantic.ValidationError`` on bad values."""
    return Settings()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the subcommand; return its exit code.

    argparse exits with 2 on a usage error; a settings error is reported on stderr and returns 2.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    if len(arguments) == 1 and arguments[0] in PARTS:
        # A part takes no arguments, and its process builds no other command's parser: the client's code and
        # the token minting's cryptography are about 10 MB that a part would hold for nothing
        # (docs/benchmark.md: Memory).
        return _handled(_cmd_part, argparse.Namespace(part=arguments[0]))
    args = build_parser().parse_args(arguments)
    return _handled(args.handler, args)


def _handled(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``handler(args)``, with a settings or key set error reported on stderr as exit code 2."""
    try:
        return handler(args)
    except pydantic.ValidationError as exc:
        print(f"chatexport: invalid settings: {_without_values(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:
        from shared.jwks import KeySetError  # loaded by whatever raised it, if anything did

        if not isinstance(exc, KeySetError):
            raise
        # A key file or public key that cannot be used (docs/keys.md).
        print(f"chatexport: {exc}", file=sys.stderr)
        return 2


def _without_values(exc: pydantic.ValidationError) -> str:
    # pydantic's own message quotes the input, whose shortened form can end in a secret (a proxy password).
    return "; ".join(
        f"{'.'.join(map(str, error['loc'])) or 'settings'}: {error['msg']}"
        for error in exc.errors(include_input=False, include_url=False)
    )


def _cmd_part(args: argparse.Namespace) -> int:
    # aiobotocore imports httpx whenever it is installed, for an HTTP session no part uses, and httpx imports
    # its command line (rich, pygments, click): about 6 MB in every part that talks to S3. The image has no
    # httpx; the development environment has it (the documentation's tools), so a part there marks it
    # missing and measures as it runs in production (docs/benchmark.md: Memory).
    for unused in ("httpx", "httpx2"):
        sys.modules.setdefault(unused, None)  # type: ignore[arg-type]
    part = PARTS[args.part]
    settings = part.settings()
    follow_parent()
    try:
        part.main(settings)
    except SchemaOutOfRange:
        return 1  # the part logged why (docs/deploy.md: Upgrading)
    return 0


def _cmd_migrate(args: argparse.Namespace) -> int:
    settings = load_settings()
    steps = [Step.PRE] if args.pre else [Step.POST] if args.post else list(Step)
    try:
        created, applied = asyncio.run(migrate_database(settings, steps=steps))
    except BadMigration as exc:
        print(f"chatexport: {exc}", file=sys.stderr)
        return 1
    if created:
        print("created the database")
    print(f"applied: {', '.join(applied)}" if applied else "applied: nothing (schema is up to date)")
    return 0


def _cmd_token(args: argparse.Namespace) -> int:
    from shared.auth import mint_token  # as the client's code: never in a part's process

    settings = load_settings()
    scopes = ["admin"] if args.admin else None
    try:
        print(mint_token(settings, user_id=args.sub, scopes=scopes, ttl_seconds=args.ttl))
    except ValueError as exc:
        print(f"chatexport token: {exc}", file=sys.stderr)
        return 2
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from devtools.corpus import ImportSummary, corpus_files, import_corpus

    settings = load_settings()
    try:
        corpus_files(args.language)  # an unknown language is a usage error: say so before connecting
    except ValueError as exc:
        print(f"chatexport: {exc}", file=sys.stderr)
        return 2

    async def run() -> ImportSummary:
        pool = await create_pool(settings)
        try:
            return await import_corpus(pool, languages=args.language, limit_files=args.limit_files)
        finally:
            await pool.close()

    started = time.monotonic()
    try:
        summary = asyncio.run(run())
    except (asyncpg.InvalidCatalogNameError, asyncpg.UndefinedTableError):
        print("chatexport: the database or its schema is missing; run `chatexport migrate` first", file=sys.stderr)
        return 1
    elapsed = time.monotonic() - started
    print(
        f"conversations: {summary.conversations}, imported: {summary.imported}, "
        f"skipped: {summary.skipped} ({elapsed:.1f} s)"
    )
    return 0


def _cmd_requeue(args: argparse.Namespace) -> int:
    """Requeue each id (docs/api.md: Administration, Admin requeue); print one line per id; exit 1 if any was not
    FAILED_REPAIR.
    """
    settings = load_settings()

    async def run() -> list[Requeue]:
        conn = await connect(settings)
        try:
            return [await requeue(conn, operation_id=operation_id) for operation_id in args.operation_ids]
        finally:
            await conn.close()

    outcomes = asyncio.run(run())
    for operation_id, outcome in zip(args.operation_ids, outcomes, strict=True):
        if outcome.requeued:
            print(f"{operation_id}: requeued")
        else:
            print(f"{operation_id}: not requeued ({outcome.state or 'no such operation'})", file=sys.stderr)
    return 0 if all(outcome.requeued for outcome in outcomes) else 1


def _cmd_health(args: argparse.Namespace) -> int:
    """Ask a part's monitoring endpoint; exit 0 on 200, 1 on anything else (refused, timeout, 503)."""
    import urllib.error
    import urllib.request

    path = "/healthz" if args.live else "/readyz"
    url = health_url(args.url, path) if args.url else _monitoring_url(load_settings(), path)
    try:
        # The scheme is http(s): ``_http_url`` checked a given URL, ``_monitoring_url`` builds one.
        with urllib.request.urlopen(url, timeout=args.timeout) as response:  # noqa: S310
            print(response.read().decode(errors="replace"))
            return 0
    except urllib.error.HTTPError as exc:
        print(f"{url}: {exc.code} {exc.read().decode(errors='replace')}", file=sys.stderr)
    except (urllib.error.URLError, OSError) as exc:
        print(f"{url}: unreachable ({exc})", file=sys.stderr)
    return 1


def health_url(url: str, path: str) -> str:
    """The endpoint ``chatexport health --url URL`` asks: ``path`` (``/readyz`` or ``/healthz``) on a base
    URL without a path (``http://host:9100`` or ``http://host:9100/``); any other URL as it is, so a full
    endpoint URL keeps working (docs/command-line.md: Command line).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.path not in ("", "/"):
        return url
    return urllib.parse.urlunsplit(parts._replace(path=path))


def _monitoring_url(settings: Settings, path: str) -> str:
    """The part's own monitoring endpoint as seen from its host: a wildcard bind is asked on loopback."""
    return local_url(settings.metrics_host, settings.metrics_port) + path


def _cmd_dev(args: argparse.Namespace) -> int:
    from devtools.supervisor import DevOptions, run_dev

    follow_parent()  # when a test or another tool supervises `dev`, it must not outlive it either
    options = DevOptions(
        workers=args.workers,
        languages=args.language,
        load_corpus=not args.no_import,
        ready_timeout=args.ready_timeout,
    )
    return run_dev(load_settings(), options)


if __name__ == "__main__":
    sys.exit(main())
