"""``chatexport schedules fetch``: the files of a schedule's runs in one folder (docs/schedule-exports.md:
Fetching the files).

Each run's file is named by its due time and operation id, ``<YYYYMMDDTHHMMSSZ>-<operation_id>.<ext>``, a split
run's parts ``...-part-<n>.<ext>``; each is downloaded, resumed and verified like any result (``download``). A
file is put in place only once verified, and a split run's first part last, so a run's first file in the
folder says the whole run is there: that is what "already fetched" means, also for a run whose result has
expired since.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chatexport.client.api import Api, ApiError
from chatexport.client.download import Downloaded, download_file, extension_of, result_files

# A download of a result that expired after the run list was read (docs/api.md: Downloads, Download).
GONE = 410


@dataclass
class Fetched:
    """What a fetch found: the files it wrote (oldest run first) and how many runs they hold, how many runs
    were already in the folder, the runs whose result expired before they were fetched, and those whose download
    the API refused otherwise, with its answer (each oldest first).
    """

    written: list[Downloaded] = field(default_factory=list)
    runs: int = 0
    present: int = 0
    expired: list[dict[str, Any]] = field(default_factory=list)
    failed: list[tuple[dict[str, Any], ApiError]] = field(default_factory=list)


async def fetch_runs(api: Api, schedule_id: str, directory: Path) -> Fetched:
    """Download every SUCCEEDED run of ``schedule_id`` that is not yet in ``directory`` (created, in an existing
    folder, once the schedule is found), oldest first, and note each EXPIRED one that is not either. A run whose
    download the API refuses is noted and the others are still fetched: one lost file does not hold back every
    later run. Raises ``ApiError`` (404 for a schedule that is not the caller's), ``aiohttp.ClientError`` (part
    files stay for the next fetch), ``NotVerified`` and ``OSError``.
    """
    runs = [run async for run in api.schedule_runs(schedule_id)]
    await asyncio.to_thread(directory.mkdir, exist_ok=True)
    fetched = Fetched()
    for run in reversed(runs):
        if _fetched_before(run, directory):
            fetched.present += 1
        elif run["state"] == "SUCCEEDED":
            await _fetch_run(api, run, directory, fetched)
        elif run["state"] == "EXPIRED":
            fetched.expired.append(run)
    return fetched


def run_file(run: dict[str, Any], directory: Path, part: int | None = None) -> Path:
    """Where the file of ``run`` (an operation representation with its ``due_at``) goes in ``directory``, or
    its part number ``part`` when given.
    """
    due = datetime.fromisoformat(run["due_at"]).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    number = "" if part is None else f"-part-{part}"
    return directory / f"{due}-{run['operation_id']}{number}{extension_of(run['request'])}"


def _fetched_before(run: dict[str, Any], directory: Path) -> bool:
    # An expired run no longer says whether it was split: either first file will do.
    return run_file(run, directory).exists() or run_file(run, directory, 1).exists()


async def _fetch_run(api: Api, run: dict[str, Any], directory: Path, fetched: Fetched) -> None:
    files = result_files(run, run_file(run, directory), lambda number: run_file(run, directory, number))
    written = []
    try:
        # The first file last: once it is in place, the whole run is.
        for file, path in reversed(files):
            written.append(await download_file(api, file, path))
    except ApiError as exc:
        if exc.status == GONE:
            fetched.expired.append(run)
        else:
            fetched.failed.append((run, exc))
    else:
        fetched.runs += 1
    fetched.written += reversed(written)
