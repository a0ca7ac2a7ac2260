"""``chatexport schedules create|list|show|pause|resume|delete|fetch``: scheduled exports from the command line
(docs/schedule-exports.md: Fetching the files).

The exit codes are the client's (``commands``): ``fetch`` exits 3 when the API refused a run's download, else
1 when a run's result expired before it was fetched, in both cases after fetching every other run
(docs/schedule-exports.md: Fetching the files).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from pathlib import Path
from typing import Any

from chatexport.client.api import Api
from chatexport.client.arguments import matching
from chatexport.client.commands import (
    EXIT_ENDED_BADLY,
    EXIT_REFUSED,
    EXIT_USAGE,
    OPERATION_ID,
    Subparsers,
    add_export_options,
    api_command,
    api_timestamp,
    connection_arguments,
    export_request,
    print_written,
    rfc3339_time,
    senders_problem,
)
from chatexport.client.schedules import fetch_runs

MODES = ("incremental", "full")


def add_commands(commands: Subparsers) -> None:
    """Add ``schedules`` and its actions to the ``chatexport`` command's subparsers."""
    schedules = commands.add_parser("schedules", help="create, list, pause, resume, delete or fetch scheduled exports")
    actions = schedules.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="export a conversation at every due time")
    _add_create_arguments(create)
    listing = actions.add_parser("list", help="your schedules, newest first")
    show = actions.add_parser("show", help="one schedule as JSON")
    pause = actions.add_parser("pause", help="stop creating runs until resumed")
    resume = actions.add_parser("resume", help="create runs again, from the next due time")
    delete = actions.add_parser("delete", help="delete a schedule; its runs and their files stay")
    fetch = actions.add_parser("fetch", help="download every finished run not yet in a folder, and verify it")
    fetch.add_argument(
        "-o",
        "--output",
        type=_folder,
        required=True,
        metavar="DIR",
        help="the folder (created if missing, in an existing one)",
    )
    for action in (show, pause, resume, delete, fetch):
        action.add_argument("schedule_id", metavar="SCHEDULE", type=_schedule_id)
    handlers = (
        (create, _create),
        (listing, _list),
        (show, _show),
        (pause, _pause),
        (resume, _resume),
        (delete, _delete),
        (fetch, _fetch),
    )
    for action, handler in handlers:
        connection_arguments(action)
        action.set_defaults(handler=api_command(handler))


def _add_create_arguments(create: argparse.ArgumentParser) -> None:
    create.add_argument("conversation_id", metavar="CONVERSATION")
    create.add_argument(
        "--every", required=True, metavar="DURATION", help="an ISO 8601 duration such as P1D, PT6H or P1M"
    )
    create.add_argument(
        "--start-at",
        type=rfc3339_time,
        metavar="TIME",
        help="the first due time, RFC 3339 with an offset, from which the others are counted (default: now)",
    )
    create.add_argument(
        "--mode",
        choices=MODES,
        help="incremental: each run exports what is new since the last one (the default); full: everything",
    )
    # A schedule's runs have no fixed end: every run after the first would be empty.
    add_export_options(create, with_end=False)
    create.add_argument("--notify-url", metavar="URL", help="where the completion and pause callbacks go")
    create.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="the create's Idempotency-Key (default: a new one); the same key again answers the same schedule",
    )


# A schedule id has an operation id's syntax (docs/api.md: Export schedules, Who sees what).
_schedule_id = matching(OPERATION_ID, "not a schedule id (1-64 of A-Z a-z 0-9 _ -)")


def _folder(value: str) -> Path:
    path = Path(value)
    if (path.exists() and not path.is_dir()) or not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{value} must name a folder, or a new one in an existing folder")
    return path


def schedule_request(args: argparse.Namespace) -> dict[str, Any]:
    """The create body of ``schedules create``'s parsed options: ``every``, the export options as
    ``export_request`` makes them, and ``start_at``, ``mode`` and ``notify`` when given.
    """
    given = {
        "start_at": api_timestamp(args.start_at),
        "mode": args.mode,
        "notify": {"url": args.notify_url} if args.notify_url else None,
    }
    return {"every": args.every, **export_request(args), **{name: value for name, value in given.items() if value}}


async def _create(api: Api, args: argparse.Namespace) -> int:
    problem = senders_problem(args)
    if problem is not None:
        print(f"chatexport schedules create: {problem}", file=sys.stderr)
        return EXIT_USAGE
    key = args.idempotency_key or f"cli-{secrets.token_urlsafe(18)}"
    created = await api.create_schedule(args.conversation_id, schedule_request(args), idempotency_key=key)
    print(_line(created.schedule) + ("  (replayed)" if created.replayed else ""))
    return 0


async def _list(api: Api, args: argparse.Namespace) -> int:
    async for schedule in api.schedules():
        print(_line(schedule))
    return 0


async def _show(api: Api, args: argparse.Namespace) -> int:
    print(json.dumps(await api.schedule(args.schedule_id), indent=2, ensure_ascii=False))
    return 0


async def _pause(api: Api, args: argparse.Namespace) -> int:
    print(_line(await api.change_schedule(args.schedule_id, "pause")))
    return 0


async def _resume(api: Api, args: argparse.Namespace) -> int:
    print(_line(await api.change_schedule(args.schedule_id, "resume")))
    return 0


async def _delete(api: Api, args: argparse.Namespace) -> int:
    await api.delete_schedule(args.schedule_id)
    print(f"{args.schedule_id}: deleted")
    return 0


async def _fetch(api: Api, args: argparse.Namespace) -> int:
    directory: Path = args.output
    fetched = await fetch_runs(api, args.schedule_id, directory)
    print_written(fetched.written)
    for run in fetched.expired:
        print(
            f"chatexport: {run['operation_id']} (due {run['due_at']}) expired before it was fetched{_lost(run)}",
            file=sys.stderr,
        )
    for run, refusal in fetched.failed:
        print(
            f"chatexport: {run['operation_id']} (due {run['due_at']}) could not be fetched: {refusal}", file=sys.stderr
        )
    print(
        f"{args.schedule_id}: runs fetched {fetched.runs}, already in {directory} {fetched.present}, "
        f"expired before they were fetched {len(fetched.expired)}, refused {len(fetched.failed)}"
    )
    if fetched.failed:
        return EXIT_REFUSED
    return EXIT_ENDED_BADLY if fetched.expired else 0


def _lost(run: dict[str, Any]) -> str:
    """What an expired run held, as far as its representation says: the seqs of its messages."""
    snapshot = run.get("snapshot")
    if snapshot is None:
        return ""
    after_seq = run["request"]["after_seq"]
    return f": its messages after seq {after_seq} up to seq {snapshot['max_seq']} are in no file of this folder"


def _line(schedule: dict[str, Any]) -> str:
    """One line of a schedule: id, state with its reasons, conversation, cadence, mode and next run."""
    state = schedule["state"]
    if schedule.get("paused_reason"):
        state += f" ({schedule['paused_reason']})"
    if schedule.get("waiting_reason"):
        state += f", waiting: {schedule['waiting_reason']}"
    next_run = schedule.get("next_run_at") or "none"
    return (
        f"{schedule['schedule_id']}  {state:<16} {schedule['conversation_id']}  every {schedule['every']}  "
        f"{schedule['mode']}  next run at {next_run}"
    )
