"""The command-line client (docs/command-line.md: Command-line client), run as the ``chatexport`` command in its own
process against the real API, relay, worker and janitor: a verified file, a rerun that follows the same
operation, a resumed download guarded by If-Range, the export options, split results, incremental runs,
and the exit codes of refusals.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from chatexport.client.api import Api
from chatexport.client.exporting import state_path
from chatexport.client.incremental import history_path
from tests.support.api_calls import expected_file, import_lines, make_conversation, read_all, submit, wait_terminal
from tests.support.messages import Auth, Client

pytestmark = pytest.mark.module_database

CID = "c-cli"
REQUEST = {"format": "jsonl"}


@dataclass(frozen=True)
class Run:
    """One run of the command: its exit code and what it printed."""

    code: int
    stdout: str
    stderr: str


async def chatexport(api: Client, token: str | None, *args: str) -> Run:
    """Run ``chatexport ARGS`` against ``api`` with ``token`` in CHATEXPORT_TOKEN; fail after 60 s."""
    env = {**os.environ, "CHATEXPORT_API_URL": str(api.make_url("")).rstrip("/")}
    env.pop("CHATEXPORT_TOKEN", None)
    if token is not None:
        env["CHATEXPORT_TOKEN"] = token
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "chatexport.cli",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return Run(process.returncode, stdout.decode(), stderr.decode())


def token_of(auth: Auth, user: str) -> str:
    return auth(user)["Authorization"].removeprefix("Bearer ")


async def conversation(api: Client, auth: Auth) -> bytes:
    """``c-cli`` of alice with 40 messages; the file its export must be."""
    await make_conversation(api, auth, CID, ["alice"])
    await import_lines(
        api, auth, CID, [{"message_id": f"m{n}", "sender_id": "alice", "body": f"body {n}"} for n in range(40)]
    )
    return expected_file(await read_all(api, auth, "alice", CID))


async def test_export_writes_a_verified_file_and_leaves_nothing_behind(
    api: Client, auth: Auth, pipeline: None, tmp_path: Path
) -> None:
    content = await conversation(api, auth)
    output = tmp_path / "out.jsonl"

    run = await chatexport(api, token_of(auth, "alice"), "export", CID, "-o", str(output))

    assert run.code == 0, run
    assert output.read_bytes() == content
    assert "(verified)" in run.stdout
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.jsonl"]


async def test_a_rerun_follows_the_operation_an_earlier_run_submitted(
    api: Client, auth: Auth, pool: asyncpg.Pool, pipeline: None, tmp_path: Path
) -> None:
    content = await conversation(api, auth)
    output = tmp_path / "out.jsonl"
    # An earlier run stored its key and submitted, then died before it saw the 202.
    key = "cli-earlier-run"
    state_path(output).write_text(
        f'{{"idempotency_key": "{key}", "conversation_id": "{CID}", "request": {{"format": "jsonl"}}}}'
    )
    async with Api(str(api.make_url("")), token_of(auth, "alice")) as client:
        earlier = await client.submit(CID, REQUEST, idempotency_key=key)

    run = await chatexport(api, token_of(auth, "alice"), "export", CID, "-o", str(output))

    assert run.code == 0, run
    assert output.read_bytes() == content
    assert await pool.fetchval("SELECT array_agg(operation_id) FROM operations") == [earlier.operation["operation_id"]]


async def test_a_state_file_of_another_export_is_a_usage_error(api: Client, auth: Auth, tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    state_path(output).write_text(
        '{"idempotency_key": "k", "conversation_id": "c-other", "request": {"format": "jsonl"}}'
    )
    run = await chatexport(api, token_of(auth, "alice"), "export", CID, "-o", str(output))
    assert run.code == 2, run
    assert "c-other" in run.stderr


async def test_download_resumes_a_part_file_and_refuses_one_that_does_not_verify(
    api: Client, auth: Auth, pipeline: None, tmp_path: Path
) -> None:
    content = await conversation(api, auth)
    response = await submit(api, auth, "alice", CID, REQUEST, "k-download")
    operation = await wait_terminal(api, auth, "alice", response.headers["Location"])
    assert operation["state"] == "SUCCEEDED"
    output = tmp_path / "result.jsonl"
    part = tmp_path / "result.jsonl.part"

    part.write_bytes(content[:100])
    resumed = await chatexport(
        api, token_of(auth, "alice"), "operations", "download", operation["operation_id"], "-o", str(output)
    )
    assert resumed.code == 0, resumed
    assert output.read_bytes() == content and not part.exists()

    output.unlink()
    part.write_bytes(b"X" * 100)  # not the file's first bytes: the rest fetched after it cannot verify
    spliced = await chatexport(
        api, token_of(auth, "alice"), "operations", "download", operation["operation_id"], "-o", str(output)
    )
    assert spliced.code == 5, spliced
    assert "part file was deleted" in spliced.stderr
    assert not part.exists() and not output.exists()


async def test_refusals_exit_with_their_code_and_print_the_problem(api: Client, auth: Auth, tmp_path: Path) -> None:
    await make_conversation(api, auth, CID, ["alice"])
    output = str(tmp_path / "out.jsonl")

    outsider = await chatexport(api, token_of(auth, "mallory"), "export", CID, "-o", output)
    assert outsider.code == 3, outsider
    assert "NOT_FOUND" in outsider.stderr and "Traceback" not in outsider.stderr
    # Refused, nothing started: no state file is left to block the next export to this path.
    assert sorted(path.name for path in tmp_path.iterdir()) == []

    # Which formats exist, the API says: the client lets its 422 speak.
    unknown_format = await chatexport(api, token_of(auth, "alice"), "export", CID, "-o", output, "--format", "xml")
    assert unknown_format.code == 3, unknown_format
    assert "VALIDATION_FAILED" in unknown_format.stderr and "\n  body.format: Input should be" in unknown_format.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == []

    no_token = await chatexport(api, None, "export", CID, "-o", output)
    assert no_token.code == 2, no_token

    unreachable = await chatexport(
        api, token_of(auth, "alice"), "export", CID, "-o", output, "--api", "http://127.0.0.1:9"
    )
    assert unreachable.code == 4, unreachable
    assert "Traceback" not in unreachable.stderr


@pytest.mark.parametrize(
    "arguments",
    [
        ("operations", "show", "../../v2/conversations"),
        ("operations", "download", "op_1", "-o", "."),
        ("export", CID, "-o", "no-such-folder/out.jsonl"),
        ("export", CID, "--api", "not-a-url"),
        ("export", CID, "--after-seq", "-1"),
        ("export", CID, "--since", "2024-05-01T08:00:00"),
        ("export", CID, "--until", "2024-02-30T08:00:00Z"),
        ("export", CID, "--since", "2024-05-02T00:00:00Z", "--until", "2024-05-01T00:00:00Z"),
        ("export", CID, "--sender", "a b"),
        ("export", CID, "--format", "../x"),
        ("export", CID, "--max-part-bytes", "5242879"),
        ("export", CID, "--incremental", "--format", "csv"),
        ("export", CID, "--incremental", "--max-part-bytes", "5242880"),
        ("export", CID, "--incremental", "--after-seq", "3"),
    ],
)
async def test_bad_arguments_are_usage_errors(api: Client, auth: Auth, arguments: tuple[str, ...]) -> None:
    run = await chatexport(api, token_of(auth, "alice"), *arguments)
    assert run.code == 2, run
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("content", ["garbage", '{"a": 1}', "[]"])
async def test_a_state_file_that_is_not_ours_is_a_usage_error(
    api: Client, auth: Auth, tmp_path: Path, content: str
) -> None:
    output = tmp_path / "out.jsonl"
    state_path(output).write_text(content)
    run = await chatexport(api, token_of(auth, "alice"), "export", CID, "-o", str(output))
    assert run.code == 2, run
    assert "not a state file" in run.stderr and "Traceback" not in run.stderr


async def only_operation(api: Client, auth: Auth) -> dict[str, Any]:
    """Alice's one operation, as the API shows it."""
    response = await api.get("/v3/operations", headers=auth("alice"))
    operations: list[dict[str, Any]] = (await response.json())["operations"]
    [operation] = operations
    return operation


async def test_the_export_options_reach_the_request(api: Client, auth: Auth, pipeline: None, tmp_path: Path) -> None:
    await conversation(api, auth)
    output = tmp_path / "out.csv.gz"

    run = await chatexport(
        api,
        token_of(auth, "alice"),
        "export",
        CID,
        "-o",
        str(output),
        "--format",
        "csv",
        "--gzip",
        "--sender",
        "alice",
        "--since",
        "2000-01-01T00:00:00+02:00",
    )

    assert run.code == 0, run
    assert "(verified)" in run.stdout and gzip.decompress(output.read_bytes())
    operation = await only_operation(api, auth)
    # Every option in canonical form: the time in UTC, the defaults shown.
    assert {
        "format": "csv",
        "compression": "gzip",
        "senders": ["alice"],
        "since": "1999-12-31T22:00:00.000Z",
        "until": None,
        "after_seq": 0,
        "before_seq": None,
        "max_part_bytes": None,
    }.items() <= operation["request"].items()
    assert operation["result"]["content_type"] == "application/gzip"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.csv.gz"]


async def test_senders_choose_whose_messages_are_exported(
    api: Client, auth: Auth, pipeline: None, tmp_path: Path
) -> None:
    await make_conversation(api, auth, CID, ["alice", "bob"])
    await import_lines(
        api,
        auth,
        CID,
        [{"message_id": f"m{n}", "sender_id": ("alice", "bob")[n % 2], "body": f"body {n}"} for n in range(20)],
    )
    bobs = [message for message in await read_all(api, auth, "alice", CID) if message["sender_id"] == "bob"]
    output = tmp_path / "bob.jsonl"

    run = await chatexport(api, token_of(auth, "alice"), "export", CID, "-o", str(output), "--sender", "bob")

    assert run.code == 0, run
    assert output.read_bytes() == expected_file(bobs)


async def test_a_split_result_is_written_part_by_part_by_export_and_by_download(
    api: Client, auth: Auth, pipeline: None, tmp_path: Path
) -> None:
    content = await conversation(api, auth)

    run = await chatexport(
        api, token_of(auth, "alice"), "export", CID, "-o", str(tmp_path / "out.jsonl"), "--max-part-bytes", "5242880"
    )

    assert run.code == 0, run
    # 40 short messages fit in one part of 5 MiB; the parts path is the same for more.
    assert (tmp_path / "out.part-1.jsonl").read_bytes() == content
    assert f"{tmp_path / 'out.part-1.jsonl'}: 40 messages" in run.stdout
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.part-1.jsonl"]

    operation = await only_operation(api, auth)
    download = await chatexport(
        api,
        token_of(auth, "alice"),
        "operations",
        "download",
        operation["operation_id"],
        "-o",
        str(tmp_path / "d.jsonl"),
    )
    assert download.code == 0, download
    assert (tmp_path / "d.part-1.jsonl").read_bytes() == content
    assert not (tmp_path / "d.jsonl").exists()


async def test_incremental_runs_append_only_what_is_new(
    api: Client, auth: Auth, pipeline: None, tmp_path: Path
) -> None:
    await conversation(api, auth)
    output = tmp_path / "out.jsonl"
    alice = token_of(auth, "alice")

    first = await chatexport(api, alice, "export", CID, "-o", str(output), "--incremental")
    await import_lines(
        api, auth, CID, [{"message_id": f"n{n}", "sender_id": "alice", "body": f"new {n}"} for n in range(10)]
    )
    second = await chatexport(api, alice, "export", CID, "-o", str(output), "--incremental")
    nothing_new = await chatexport(api, alice, "export", CID, "-o", str(output), "--incremental")

    assert (first.code, second.code, nothing_new.code) == (0, 0, 0), (first, second, nothing_new)
    messages = await read_all(api, auth, "alice", CID)
    assert output.read_bytes() == expected_file(messages)
    assert "appended 10 messages" in second.stdout and "appended 0 messages" in nothing_new.stdout
    assert json.loads(history_path(output).read_text())["next_after_seq"] == messages[-1]["seq"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.jsonl", "out.jsonl.incremental.json"]


async def test_incremental_gzip_runs_make_one_valid_gzip_file(
    api: Client, auth: Auth, pipeline: None, tmp_path: Path
) -> None:
    await conversation(api, auth)
    output = tmp_path / "out.jsonl.gz"
    alice = token_of(auth, "alice")

    first = await chatexport(api, alice, "export", CID, "-o", str(output), "--incremental", "--gzip")
    await import_lines(api, auth, CID, [{"message_id": "late", "sender_id": "alice", "body": "late"}])
    second = await chatexport(api, alice, "export", CID, "-o", str(output), "--incremental", "--gzip")

    assert (first.code, second.code) == (0, 0), (first, second)
    assert gzip.decompress(output.read_bytes()) == expected_file(await read_all(api, auth, "alice", CID))


async def test_an_append_a_crash_interrupted_is_cut_back_by_the_next_run(
    api: Client, auth: Auth, pipeline: None, tmp_path: Path
) -> None:
    await conversation(api, auth)
    output = tmp_path / "out.jsonl"
    alice = token_of(auth, "alice")
    first = await chatexport(api, alice, "export", CID, "-o", str(output), "--incremental")
    assert first.code == 0, first
    # What a crash after the append and before the watermark's save leaves: the pending watermark recorded,
    # OUTPUT longer than the size recorded with it.
    state = json.loads(history_path(output).read_text())
    history_path(output).write_text(json.dumps({**state, "pending_next_after_seq": state["next_after_seq"] + 1}))
    with output.open("ab") as file:
        file.write(b'{"seq": 41, "body": "half a li')
    await import_lines(api, auth, CID, [{"message_id": "late", "sender_id": "alice", "body": "late"}])

    rerun = await chatexport(api, alice, "export", CID, "-o", str(output), "--incremental")

    assert rerun.code == 0, rerun
    assert output.read_bytes() == expected_file(await read_all(api, auth, "alice", CID))
