"""The command-line client's progress on a piped stderr during a real export (docs/command-line.md: Command-line client,
Progress): lines come while the export waits, paced by the client's clock, and end with the measured counts.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from devtools.localsystem import LocalSystem
from shared.auth import mint_token
from tests.support.api_calls import Headers, import_lines, make_conversation

pytestmark = pytest.mark.e2e

CID = "e2e-piped-progress"
MESSAGES = 3_000
INTERVAL_SECONDS = 0.2
# Lines the test reads while no worker can run the export: more than a state change alone would print.
LINES_WHILE_STOPPED = 3
LINE_TIMEOUT_SECONDS = 30


async def next_line(stream: asyncio.StreamReader) -> str:
    line = await asyncio.wait_for(stream.readline(), LINE_TIMEOUT_SECONDS)
    return line.decode()


def fields(line: str) -> dict[str, str]:
    """A progress line's fields (none of the values here holds a space)."""
    assert line.startswith("chatexport progress ") and line.endswith("\n"), repr(line)
    return dict(field.split("=", 1) for field in line.removeprefix("chatexport progress ").split())


async def test_a_piped_stderr_gets_progress_lines_while_the_export_waits(
    system: LocalSystem, live_api: Any, live_auth: Headers, tmp_path: Path
) -> None:
    await make_conversation(live_api, live_auth, CID, ["alice"])
    await import_lines(
        live_api, live_auth, CID, [{"message_id": f"m{n}", "sender_id": "alice", "body": "x"} for n in range(MESSAGES)]
    )
    output = tmp_path / "out.jsonl"
    token = mint_token(system.settings(), user_id="alice")
    command = ["export", CID, "-o", str(output), "--api", system.base_url, "--token", token]
    with system.group.paused([name for name in system.group.pids() if name.startswith("worker")]):
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "chatexport.cli",
            *command,
            "--progress-interval",
            str(INTERVAL_SECONDS),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None and process.stderr is not None
        try:
            # No worker can run the export yet: these are the lines a hung export shows.
            waiting = [await next_line(process.stderr) for _ in range(LINES_WHILE_STOPPED)]
        except BaseException:
            process.kill()
            raise
    try:
        rest, stdout = await asyncio.wait_for(
            asyncio.gather(process.stderr.read(), process.stdout.read()), LINE_TIMEOUT_SECONDS
        )
        code = await asyncio.wait_for(process.wait(), LINE_TIMEOUT_SECONDS)
    except BaseException:
        process.kill()
        raise
    assert code == 0, rest

    assert [(fields(line)["state"], fields(line)["messages"]) for line in waiting] == [
        ("QUEUED", "0")
    ] * LINES_WHILE_STOPPED
    elapsed = [float(fields(line)["elapsed"].removesuffix("s")) for line in waiting]
    assert elapsed == sorted(elapsed) and elapsed[-1] - elapsed[0] >= INTERVAL_SECONDS
    later = rest.decode().splitlines(keepends=True)
    last = fields(later[-1])
    assert (last["state"], last["phase"], last["messages"]) == ("SUCCEEDED", "done", str(MESSAGES))
    assert int(last["bytes"]) == output.stat().st_size
    everything = "".join(waiting + later)
    assert "\r" not in everything and "\x1b" not in everything
    assert b"(verified)" in stdout
