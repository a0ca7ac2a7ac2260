"""The client's subcommands of ``chatexport``: ``export`` and ``operations list|show|cancel|download``
(docs/command-line.md: Command-line client).

Exit codes: 0 done; 1 the export ended FAILED, CANCELED, FAILED_REPAIR or EXPIRED (for ``schedules fetch``: a
run's result expired before it was fetched); 2 usage; 3 the API
refused the request (its problem's ``code`` and ``detail`` are printed); 4 the API could not be reached;
5 the downloaded file did not match its status (the part file is deleted); 6 a local file could not be
read or written; 130 interrupted. Never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import urllib.parse
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeAlias

import aiohttp
from rich.console import Console

from chatexport.client.api import STORAGE_RETRIES, Api, ApiError
from chatexport.client.arguments import matching, positive_seconds
from chatexport.client.download import (
    Downloaded,
    NotVerified,
    StorageRefused,
    StorageUnavailable,
    download_result,
    extension_of,
)
from chatexport.client.exporting import ExportOutcome, export, export_incrementally
from chatexport.client.progress import DEFAULT_INTERVAL_SECONDS, MIN_INTERVAL_SECONDS, ProgressDisplay, human_bytes
from chatexport.client.statefiles import UnusableStateFile
from chatexport.client.tokens import COMMAND_TIMEOUT_SECONDS, Tokens, TokenUnavailable

DEFAULT_API_URL = "http://127.0.0.1:8080"
EXIT_ENDED_BADLY, EXIT_USAGE, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_NOT_VERIFIED, EXIT_LOCAL_FILE = 1, 2, 3, 4, 5, 6
EXIT_INTERRUPTED = 130
# The API's id syntaxes (docs/api.md: API reference): anything else is a usage error, never a path or a request.
OPERATION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
USER_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
# A format's name, which names the output file (its extension): which names exist, the API's 422 says.
FORMAT_NAME = re.compile(r"[a-z0-9]{1,16}")
# RFC 3339 section 5.6 date-time with its offset (fromisoformat alone also takes week dates, spaces, no offset).
RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
)
# The years the API takes, in UTC, and the largest seq (Postgres' bigint).
YEARS = range(1000, 10000)
MAX_SEQ = 2**63 - 1
# The submit's bounds (docs/api.md: Submitting an export, Export options).
MAX_SENDERS = 100
MIN_PART_BYTES = 5 * 1024 * 1024

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_commands(commands: Subparsers) -> None:
    """Add ``export`` and ``operations`` to the ``chatexport`` command's subparsers."""
    _add_export(commands)
    operations = commands.add_parser("operations", help="list, show, cancel or download your exports")
    actions = operations.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="your newest exports")
    listing.add_argument("--state", help="only exports in this state")
    listing.add_argument("--limit", type=int, default=20, help="how many (1-100, default 20)")
    show = actions.add_parser("show", help="one export's status as JSON")
    cancel = actions.add_parser("cancel", help="cancel an export")
    download = actions.add_parser("download", help="download a finished export, resumably, and verify it")
    download.add_argument(
        "-o", "--output", type=_output, help="the file to write (default: OPERATION.FORMAT, .gz when compressed)"
    )
    for action in (show, cancel, download):
        action.add_argument("operation_id", metavar="OPERATION", type=_operation_id)
    for action, handler in ((listing, _list), (show, _show), (cancel, _cancel), (download, _download)):
        connection_arguments(action)
        action.set_defaults(handler=api_command(handler))


def _add_export(commands: Subparsers) -> None:
    sub = commands.add_parser("export", help="export a conversation into a file, resumably")
    connection_arguments(sub)
    sub.add_argument("conversation_id", metavar="CONVERSATION")
    sub.add_argument(
        "-o", "--output", type=_output, help="the file to write (default: CONVERSATION.FORMAT, .gz with --gzip)"
    )
    add_export_options(sub, with_end=True)
    sub.add_argument(
        "--incremental",
        action="store_true",
        help="append what is new since the last --incremental run to the output (jsonl, one file)",
    )
    sub.add_argument(
        "--progress-interval",
        type=interval_seconds,
        default=DEFAULT_INTERVAL_SECONDS,
        metavar="SECONDS",
        help="when stderr is not a terminal, a progress line at least this often (default %(default)g)",
    )
    sub.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr, only the result and errors")
    sub.set_defaults(handler=_cmd_export)


def add_export_options(parser: argparse.ArgumentParser, *, with_end: bool) -> None:
    """Add the submit's options to ``parser`` (docs/api.md: Submitting an export, Export options), ``--before-seq`` and
    ``--until`` only ``with_end`` (else they are None); ``export_request`` turns them into a request.
    """
    parser.add_argument("--after-seq", type=_seq, help="export messages after this seq")
    if with_end:
        parser.add_argument("--before-seq", type=_seq, help="export messages before this seq")
    parser.add_argument(
        "--since", type=rfc3339_time, metavar="TIME", help="messages sent at or after this RFC 3339 time with offset"
    )
    if with_end:
        parser.add_argument(
            "--until", type=rfc3339_time, metavar="TIME", help="messages sent before this RFC 3339 time with offset"
        )
    parser.add_argument(
        "--sender",
        action="append",
        type=_sender,
        metavar="ID",
        help=f"only this sender's messages; repeatable (at most {MAX_SENDERS})",
    )
    parser.add_argument(
        "--format",
        type=_format_name,
        default="jsonl",
        metavar="NAME",
        help="the file's format, as the API names it (default jsonl); an unknown one, the API refuses",
    )
    parser.add_argument("--gzip", action="store_true", help="compress the file with gzip")
    parser.add_argument(
        "--max-part-bytes",
        type=_part_bytes,
        metavar="N",
        help=f"split the file into parts of at most N bytes (N >= {MIN_PART_BYTES}), written beside the output",
    )
    if with_end:
        # Media are the submit's alone: a schedule does not take them.
        parser.add_argument(
            "--media",
            action="store_true",
            help="a ZIP holding the file and the attachments its messages carry, checked against its manifest",
        )
        parser.add_argument(
            "--media-type",
            action="append",
            metavar="TYPE",
            help="with --media, only attachments of this media type (image/png, or image/* for every image);"
            " repeatable",
        )
        parser.add_argument("--media-max-file-bytes", type=_seq, metavar="N", help="with --media, each file at most N")
        parser.add_argument("--media-max-total-bytes", type=_seq, metavar="N", help="with --media, all at most N")
    else:
        parser.set_defaults(
            before_seq=None,
            until=None,
            media=False,
            media_type=None,
            media_max_file_bytes=None,
            media_max_total_bytes=None,
        )


def connection_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--api`` and ``--token`` to ``parser``, a subcommand that talks to the API."""
    parser.add_argument(
        "--api",
        type=_api_url,
        default=os.environ.get("CHATEXPORT_API_URL", DEFAULT_API_URL),
        help="the API's base URL (default: $CHATEXPORT_API_URL, else %(default)s)",
    )
    parser.add_argument(
        "--token", default=os.environ.get("CHATEXPORT_TOKEN"), help="bearer token (default: $CHATEXPORT_TOKEN)"
    )
    parser.add_argument(
        "--token-command",
        default=os.environ.get("CHATEXPORT_TOKEN_COMMAND"),
        metavar="COMMAND",
        help="a command that prints a bearer token, run when the token is missing, about to expire or refused"
        " (default: $CHATEXPORT_TOKEN_COMMAND)",
    )
    parser.add_argument(
        "--token-command-timeout",
        type=positive_seconds,
        default=os.environ.get("CHATEXPORT_TOKEN_COMMAND_TIMEOUT_SECONDS", str(COMMAND_TIMEOUT_SECONDS)),
        metavar="SECONDS",
        help="how long the token command may take (default: $CHATEXPORT_TOKEN_COMMAND_TIMEOUT_SECONDS, else"
        " %(default)s)",
    )
    parser.add_argument(
        "--storage-retries",
        type=_retries,
        default=STORAGE_RETRIES,
        metavar="N",
        help="how often a download from the file storage is tried again in one run when its connection fails"
        " (default %(default)s)",
    )


def _retries(value: str) -> int:
    try:
        retries = int(value)
    except ValueError:
        retries = -1
    if not 0 <= retries <= 100:
        raise argparse.ArgumentTypeError(f"not a number of retries from 0 to 100: {value!r}")
    return retries


def _api_url(value: str) -> str:
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {value!r}")
    return value


def interval_seconds(value: str) -> float:
    """``value`` as seconds between progress lines, at least ``MIN_INTERVAL_SECONDS`` (a smaller one would
    flood a log); raises ``ArgumentTypeError``.
    """
    seconds = positive_seconds(value)
    if seconds < MIN_INTERVAL_SECONDS:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_INTERVAL_SECONDS:g} seconds")
    return seconds


_operation_id = matching(OPERATION_ID, "not an operation id (1-64 of A-Z a-z 0-9 _ -)")


def _output(value: str) -> Path:
    path = Path(value)
    if path.is_dir() or not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{value} must name a file in an existing folder")
    return path


def _seq(value: str) -> int:
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_SEQ:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to {MAX_SEQ}")
    return int(value)


def rfc3339_time(value: str) -> datetime:
    """``value``, an RFC 3339 date-time with an offset, in UTC to the millisecond, for argparse; raises
    ``ArgumentTypeError``.
    """
    if RFC3339.fullmatch(value):
        # Out of range (a day 30 of February, an instant before year 1 in UTC) is as bad as a wrong syntax.
        with contextlib.suppress(ValueError, OverflowError):
            instant = datetime.fromisoformat(value.upper()).astimezone(UTC)
            if instant.year not in YEARS:
                raise ValueError(value)
            # In UTC to the millisecond, the next whole one as the API takes it (docs/api.md: Submitting an export,
            # Export options): equal windows make equal requests and state files.
            below = instant.replace(microsecond=instant.microsecond // 1000 * 1000)
            return below if below == instant else below + timedelta(milliseconds=1)
    raise argparse.ArgumentTypeError("not an RFC 3339 date-time with an offset, such as 2024-05-01T08:00:00Z")


_format_name = matching(FORMAT_NAME, "not a format name (1-16 of a-z 0-9)")
_sender = matching(USER_ID, "not a user id (1-64 of A-Z a-z 0-9 _ . : -)")


def _part_bytes(value: str) -> int:
    size = _seq(value)
    if size < MIN_PART_BYTES:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_PART_BYTES} (5 MiB)")
    return size


def _cmd_export(args: argparse.Namespace) -> int:
    problem = _export_usage_problem(args)
    if problem is not None:
        print(f"chatexport export: {problem}", file=sys.stderr)
        return EXIT_USAGE
    request = export_request(args)
    output: Path = args.output or Path(args.conversation_id + extension_of(request))
    exporting = export_incrementally if args.incremental else export
    progress = ProgressDisplay(Console(stderr=True), interval=args.progress_interval, quiet=args.quiet)

    async def run(api: Api) -> int:
        outcome = await exporting(
            api, conversation_id=args.conversation_id, request=request, output=output, progress=progress
        )
        return _report(outcome, appended=args.incremental)

    return run_on_api(args, run)


def _export_usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``export``'s options taken together, or None."""
    if args.since is not None and args.until is not None and args.until <= args.since:
        return "--until must be later than --since"
    problem = senders_problem(args)
    if problem is not None:
        return problem
    if args.incremental and (args.after_seq is not None or args.before_seq is not None):
        # The watermark is the after_seq; a fixed end would turn the run after the one that reached it into a 422.
        return "--incremental follows the conversation as it grows: it takes no --after-seq or --before-seq"
    limits = (args.media_type, args.media_max_file_bytes, args.media_max_total_bytes)
    if not args.media and any(limit is not None for limit in limits):
        return "--media-type and the --media-max-* limits need --media"
    if args.media and (args.gzip or args.incremental):
        return "--media writes ZIPs: it takes no --gzip or --incremental"
    if args.incremental and (args.format != "jsonl" or args.max_part_bytes is not None):
        # Only JSONL files (and gzip members) concatenate into one valid file of the same format.
        return "--incremental appends to one JSONL file: it takes only --format jsonl and no --max-part-bytes"
    return None


def senders_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the ``--sender`` options of ``args``, or None."""
    return f"at most {MAX_SENDERS} different --sender" if len(set(args.sender or ())) > MAX_SENDERS else None


def export_request(args: argparse.Namespace) -> dict[str, Any]:
    """The submit body of ``export``'s parsed options: ``format`` and each option given, in the API's canonical
    form (times in UTC, senders sorted without repeats); without options, the body earlier versions stored.
    """
    options = {
        "after_seq": args.after_seq,
        "before_seq": args.before_seq,
        "since": api_timestamp(args.since),
        "until": api_timestamp(args.until),
        "senders": sorted(set(args.sender)) if args.sender else None,
        "compression": "gzip" if args.gzip else None,
        "max_part_bytes": args.max_part_bytes,
        "media": True if args.media else None,
        "media_types": sorted({kind.lower() for kind in args.media_type}) if args.media_type else None,
        "media_max_file_bytes": args.media_max_file_bytes,
        "media_max_total_bytes": args.media_max_total_bytes,
    }
    return {"format": args.format, **{name: value for name, value in options.items() if value is not None}}


def api_timestamp(instant: datetime | None) -> str | None:
    """``instant`` as the API writes a time (UTC, milliseconds, ``Z``); None stays None."""
    return None if instant is None else instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _report(outcome: ExportOutcome, *, appended: bool = False) -> int:
    """Print what was written (``appended`` to OUTPUT, for an incremental export), or how the export ended
    when it did not succeed; the exit code.
    """
    operation = outcome.operation
    if outcome.written is None:
        error = operation.get("error") or {}
        detail = f": {error.get('code')}: {error.get('message')}" if error else ""
        print(f"{operation['operation_id']} ended {operation['state']}{detail}", file=sys.stderr)
        return EXIT_ENDED_BADLY
    print_written(outcome.written, appended=appended)
    result = operation["result"]
    if result.get("parts") is not None:
        print(f"{operation['operation_id']}: {result['message_count']} messages in {len(outcome.written)} parts")
    return 0


def print_written(files: list[Downloaded], *, appended: bool = False) -> None:
    """Print a line on stdout for each verified file: its path, messages, size and sha256."""
    for file in files:
        print(
            f"{file.path}: {'appended ' if appended else ''}{file.message_count} messages, "
            f"{human_bytes(file.size_bytes)}, sha256 {file.sha256} (verified)"
        )


def api_command(handler: Callable[[Api, argparse.Namespace], Awaitable[int]]) -> Callable[..., int]:
    """The ``(args) -> int`` handler that runs ``handler(api, args)`` on a session (``run_on_api``)."""

    def command(args: argparse.Namespace) -> int:
        return run_on_api(args, lambda api: handler(api, args))

    return command


async def _list(api: Api, args: argparse.Namespace) -> int:
    for operation in await api.operations(state=args.state, limit=args.limit):
        progress = operation["progress"]
        print(
            f"{operation['operation_id']}  {operation['state']:<16} {operation['conversation_id']}  "
            f"{operation['created_at']}  {progress['messages_written']} messages"
        )
    return 0


async def _show(api: Api, args: argparse.Namespace) -> int:
    print(json.dumps(await api.operation(args.operation_id), indent=2, ensure_ascii=False))
    return 0


async def _cancel(api: Api, args: argparse.Namespace) -> int:
    operation = await api.cancel(args.operation_id)
    print(f"{operation['operation_id']}: {operation['state']}")
    return 0


async def _download(api: Api, args: argparse.Namespace) -> int:
    operation = await api.operation(args.operation_id)
    if operation["state"] != "SUCCEEDED":
        print(f"{operation['operation_id']} is {operation['state']}: there is no file to download", file=sys.stderr)
        return EXIT_ENDED_BADLY
    output: Path = args.output or Path(args.operation_id + extension_of(operation["request"]))
    return _report(ExportOutcome(operation, await download_result(api, operation, output)))


def run_on_api(args: argparse.Namespace, work: Callable[[Api], Awaitable[int]]) -> int:
    """Run ``work`` on a session with the arguments' API and token; map every failure to its exit code."""
    if not args.token and not args.token_command:
        print("chatexport: no token: pass --token or set CHATEXPORT_TOKEN or CHATEXPORT_TOKEN_COMMAND", file=sys.stderr)
        return EXIT_USAGE

    async def session() -> int:
        tokens = Tokens(args.token, command=args.token_command, timeout_seconds=args.token_command_timeout)
        async with Api(args.api, tokens, storage_retries=args.storage_retries) as api:
            return await work(api)

    try:
        return asyncio.run(session())
    except ApiError as exc:
        print(f"chatexport: the API refused: {exc.code}: {exc.detail}", *exc.errors, sep="\n  ", file=sys.stderr)
        return EXIT_REFUSED
    except TokenUnavailable as exc:
        print(f"chatexport: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except (aiohttp.ClientError, TimeoutError) as exc:
        print(
            f"chatexport: the API at {args.api} cannot be reached ({type(exc).__name__}); run the same command again",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    except BrokenPipeError:
        # Whoever reads the output stopped (`| head`): nothing went wrong. Later writes (the interpreter's
        # flush at exit) go nowhere instead of failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        print(f"chatexport: {exc.filename or 'a local file'}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_LOCAL_FILE
    except NotVerified as exc:
        print(f"chatexport: {exc}", file=sys.stderr)
        return EXIT_NOT_VERIFIED
    except (StorageRefused, StorageUnavailable) as exc:
        print(f"chatexport: {exc}; run the same command again to resume", file=sys.stderr)
        return EXIT_UNREACHABLE
    except UnusableStateFile as exc:
        print(f"chatexport: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("chatexport: interrupted; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
