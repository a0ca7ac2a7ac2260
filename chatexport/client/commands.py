"""The client's subcommands of ``chatexport``: ``export`` and ``operations list|show|cancel|download``
(README: Command-line client).

Exit codes: 0 done; 1 the export ended FAILED, CANCELED, FAILED_REPAIR or EXPIRED; 2 usage; 3 the API
refused the request (its problem's ``code`` and ``detail`` are printed); 4 the API could not be reached;
5 the downloaded file did not match its status (the part file is deleted); 6 a local file could not be
read or written; 130 interrupted. Never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeAlias

import aiohttp
from rich.console import Console

from chatexport.client.api import Api, ApiError
from chatexport.client.download import NotVerified, download_result
from chatexport.client.exporting import UnusableStateFile, export
from chatexport.client.progress import Progress, human_bytes

DEFAULT_API_URL = "http://127.0.0.1:8080"
EXIT_ENDED_BADLY, EXIT_USAGE, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_NOT_VERIFIED, EXIT_LOCAL_FILE = 1, 2, 3, 4, 5, 6
EXIT_INTERRUPTED = 130
# The API's operation id syntax (README: API reference): anything else is a usage error, never a path.
OPERATION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_commands(commands: Subparsers) -> None:
    """Add ``export`` and ``operations`` to the ``chatexport`` command's subparsers."""
    sub = commands.add_parser("export", help="export a conversation into a file, resumably")
    _connection_arguments(sub)
    sub.add_argument("conversation_id", metavar="CONVERSATION")
    sub.add_argument("-o", "--output", type=_output, help="the file to write (default: CONVERSATION.jsonl)")
    sub.add_argument("--after-seq", type=_seq, help="export messages after this seq")
    sub.add_argument("--before-seq", type=_seq, help="export messages before this seq")
    sub.set_defaults(handler=_cmd_export)

    operations = commands.add_parser("operations", help="list, show, cancel or download your exports")
    actions = operations.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="your newest exports")
    listing.add_argument("--state", help="only exports in this state")
    listing.add_argument("--limit", type=int, default=20, help="how many (1-100, default 20)")
    show = actions.add_parser("show", help="one export's status as JSON")
    cancel = actions.add_parser("cancel", help="cancel an export")
    download = actions.add_parser("download", help="download a finished export, resumably, and verify it")
    download.add_argument("-o", "--output", type=_output, help="the file to write (default: OPERATION.jsonl)")
    for action in (show, cancel, download):
        action.add_argument("operation_id", metavar="OPERATION", type=_operation_id)
    for action, handler in ((listing, _list), (show, _show), (cancel, _cancel), (download, _download)):
        _connection_arguments(action)
        action.set_defaults(handler=_operations_command(handler))


def _connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api",
        type=_api_url,
        default=os.environ.get("CHATEXPORT_API_URL", DEFAULT_API_URL),
        help="the API's base URL (default: $CHATEXPORT_API_URL, else %(default)s)",
    )
    parser.add_argument(
        "--token", default=os.environ.get("CHATEXPORT_TOKEN"), help="bearer token (default: $CHATEXPORT_TOKEN)"
    )


def _api_url(value: str) -> str:
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {value!r}")
    return value


def _operation_id(value: str) -> str:
    if not OPERATION_ID.fullmatch(value):
        raise argparse.ArgumentTypeError("not an operation id (1-64 of A-Z a-z 0-9 _ -)")
    return value


def _output(value: str) -> Path:
    path = Path(value)
    if path.is_dir() or not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{value} must name a file in an existing folder")
    return path


def _seq(value: str) -> int:
    if not (value.isascii() and value.isdigit()):
        raise argparse.ArgumentTypeError("must be a non-negative integer")
    return int(value)


def _cmd_export(args: argparse.Namespace) -> int:
    request: dict[str, Any] = {"format": "jsonl"}
    if args.after_seq is not None:
        request["after_seq"] = args.after_seq
    if args.before_seq is not None:
        request["before_seq"] = args.before_seq
    output: Path = args.output or Path(f"{args.conversation_id}.jsonl")
    console = Console(stderr=True)

    async def run(api: Api) -> int:
        outcome = await export(
            api, conversation_id=args.conversation_id, request=request, output=output, progress=Progress(console)
        )
        return _report(outcome.operation, outcome.written)

    return _run(args, run)


def _report(operation: dict[str, Any], written: Path | None) -> int:
    if written is None:
        error = operation.get("error") or {}
        detail = f": {error.get('code')}: {error.get('message')}" if error else ""
        print(f"{operation['operation_id']} ended {operation['state']}{detail}", file=sys.stderr)
        return EXIT_ENDED_BADLY
    result = operation["result"]
    print(
        f"{written}: {result['message_count']} messages, {human_bytes(result['size_bytes'])}, "
        f"sha256 {result['sha256']} (verified)"
    )
    return 0


def _operations_command(handler: Callable[[Api, argparse.Namespace], Awaitable[int]]) -> Callable[..., int]:
    def command(args: argparse.Namespace) -> int:
        return _run(args, lambda api: handler(api, args))

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
    output: Path = args.output or Path(f"{args.operation_id}.jsonl")
    await download_result(api, operation, output)
    return _report(operation, output)


def _run(args: argparse.Namespace, work: Callable[[Api], Awaitable[int]]) -> int:
    """Run ``work`` on a session with the arguments' API and token; map every failure to its exit code."""
    if not args.token:
        print("chatexport: no token: pass --token or set CHATEXPORT_TOKEN", file=sys.stderr)
        return EXIT_USAGE

    async def session() -> int:
        async with Api(args.api, args.token) as api:
            return await work(api)

    try:
        return asyncio.run(session())
    except ApiError as exc:
        print(f"chatexport: the API refused: {exc.code}: {exc.detail}", file=sys.stderr)
        return EXIT_REFUSED
    except (aiohttp.ClientError, TimeoutError) as exc:
        print(
            f"chatexport: the API at {args.api} cannot be reached ({type(exc).__name__}); run the same command again",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    except OSError as exc:
        print(f"chatexport: {exc.filename or 'a local file'}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_LOCAL_FILE
    except NotVerified as exc:
        print(f"chatexport: {exc}", file=sys.stderr)
        return EXIT_NOT_VERIFIED
    except UnusableStateFile as exc:
        print(f"chatexport: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("chatexport: interrupted; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
