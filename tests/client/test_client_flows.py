"""The client's export flows against an in-process stand-in for the API that follows its contract (docs/api.md:
Submitting an export, Export options): split results downloaded part by part and resumed, incremental runs that
append only what is new and survive a crash between the append and the watermark's save, and the progress
line's use of the estimate. The same flows against the real API are in
``tests/client/test_client.py``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from rich.console import Console

from chatexport.client import incremental
from chatexport.client.api import Api, ApiError
from chatexport.client.exporting import ExportOutcome, export, export_incrementally, state_path
from chatexport.client.incremental import history_path
from chatexport.client.progress import Clock, LiveLine, ProgressDisplay

CID = "c1"


@dataclass
class FakeApi:
    """The submit, status and download routes of the API for one conversation, every export SUCCEEDED at
    once; ``submits`` counts new operations, ``gets`` the downloads of each path, ``fail_once`` the paths
    that answer 503 the next time they are asked.
    """

    messages: list[dict[str, Any]] = field(default_factory=list)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    submits: list[dict[str, Any]] = field(default_factory=list)
    gets: Counter[str] = field(default_factory=Counter)
    fail_once: set[str] = field(default_factory=set)

    def add(self, count: int, sender: str = "alice") -> None:
        first = len(self.messages) + 1
        self.messages += [
            {"seq": seq, "sender_id": sender, "body": f"body {seq}"} for seq in range(first, first + count)
        ]

    def lines(self, *, senders: tuple[str, ...] = ("alice", "bob"), after_seq: int = 0) -> bytes:
        """The JSONL export of the messages of ``senders`` after ``after_seq``."""
        return b"".join(_line(m) for m in self.messages if m["seq"] > after_seq and m["sender_id"] in senders)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v3/conversations/{cid}/exports", self._submit)
        app.router.add_get("/v3/operations/{id}", self._operation)
        app.router.add_get("/v3/exports/{id}/result", self._file)
        app.router.add_get("/v3/exports/{id}/result/parts/{number}", self._file)
        return app

    async def _submit(self, request: web.Request) -> web.Response:
        key = request.headers["Idempotency-Key"]
        if key not in self.operations:
            body = await request.json()
            self.submits.append(body)
            self.operations[key] = self._succeeded(f"op_{len(self.submits)}", body)
        return web.json_response(self.operations[key], status=202)

    async def _operation(self, request: web.Request) -> web.Response:
        [operation] = [op for op in self.operations.values() if op["operation_id"] == request.match_info["id"]]
        return web.json_response(operation)

    async def _file(self, request: web.Request) -> web.Response:
        self.gets[request.path] += 1
        if request.path in self.fail_once:
            self.fail_once.discard(request.path)
            return web.json_response({"code": "UNAVAILABLE", "detail": "try again"}, status=503)
        if request.path not in self.files:
            return web.json_response({"code": "RESULT_IS_SPLIT", "detail": "download the parts"}, status=409)
        return web.Response(body=self.files[request.path])

    def _succeeded(self, operation_id: str, body: dict[str, Any]) -> dict[str, Any]:
        after_seq = body.get("after_seq", 0)
        chosen = [
            m for m in self.messages if m["seq"] > after_seq and m["sender_id"] in body.get("senders", [m["sender_id"]])
        ]
        encode = gzip.compress if body.get("compression") == "gzip" else bytes
        summary = {
            "expires_at": "2099-01-01T00:00:00.000Z",
            "message_count": len(chosen),
            "content_type": "application/gzip" if body.get("compression") == "gzip" else "application/x-ndjson",
            "next_after_seq": max([after_seq, *(m["seq"] for m in self.messages)]),
        }
        result_url = f"/v3/exports/{operation_id}/result"
        if "max_part_bytes" not in body:
            result = {**summary, **self._publish(result_url, encode(b"".join(map(_line, chosen))))}
        else:
            parts = _split(chosen, body["max_part_bytes"])
            result = {
                **summary,
                "parts": [
                    {
                        "number": number,
                        **self._publish(f"{result_url}/parts/{number}", encode(b"".join(map(_line, part)))),
                        "message_count": len(part),
                        "first_seq": part[0]["seq"],
                        "last_seq": part[-1]["seq"],
                    }
                    for number, part in enumerate(parts, start=1)
                ],
            }
        return {
            "operation_id": operation_id,
            "state": "SUCCEEDED",
            "done": True,
            "conversation_id": CID,
            "request": {"format": "jsonl", "compression": "none", "after_seq": 0, **body},
            "estimate": {"messages_at_most": len(chosen)},
            "progress": {"phase": "done", "messages_written": len(chosen), "bytes_written": 0},
            "result": result,
        }

    def _publish(self, url: str, content: bytes) -> dict[str, Any]:
        self.files[url] = content
        return {"url": url, "size_bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def _split(messages: list[dict[str, Any]], max_part_bytes: int) -> list[list[dict[str, Any]]]:
    parts: list[list[dict[str, Any]]] = [[]]
    for message in messages:
        if parts[-1] and len(b"".join(map(_line, [*parts[-1], message]))) > max_part_bytes:
            parts.append([])
        parts[-1].append(message)
    return parts


@pytest.fixture
def fake() -> FakeApi:
    return FakeApi()


@pytest.fixture
async def api(fake: FakeApi) -> AsyncIterator[Api]:
    async with TestServer(fake.app()) as server, Api(str(server.make_url("")), "token") as client:
        yield client


def quiet() -> ProgressDisplay:
    return ProgressDisplay(Console(file=io.StringIO()))


async def run(api: Api, output: Path, request: dict[str, Any], *, incrementally: bool = False) -> ExportOutcome:
    exporting = export_incrementally if incrementally else export
    return await exporting(api, conversation_id=CID, request=request, output=output, progress=quiet())


class Crash(Exception):
    """The process dies here."""


async def test_a_split_result_is_written_part_by_part_beside_the_output(
    api: Api, fake: FakeApi, tmp_path: Path
) -> None:
    fake.add(6)
    outcome = await run(
        api, tmp_path / "c1.jsonl.gz", {"format": "jsonl", "compression": "gzip", "max_part_bytes": 100}
    )

    assert outcome.written is not None
    names = [file.path.name for file in outcome.written]
    assert names == ["c1.part-1.jsonl.gz", "c1.part-2.jsonl.gz", "c1.part-3.jsonl.gz"]
    content = b"".join(gzip.decompress(file.path.read_bytes()) for file in outcome.written)
    assert content == fake.lines()
    assert [file.message_count for file in outcome.written] == [2, 2, 2]
    assert sorted(path.name for path in tmp_path.iterdir()) == names  # no state file, no part file


async def test_a_split_download_resumes_with_the_parts_already_in_place(
    api: Api, fake: FakeApi, tmp_path: Path
) -> None:
    fake.add(6)
    output = tmp_path / "c1.jsonl"
    fake.fail_once.add("/v3/exports/op_1/result/parts/2")
    with pytest.raises(ApiError):
        await run(api, output, {"format": "jsonl", "max_part_bytes": 100})
    assert state_path(output).exists() and (tmp_path / "c1.part-1.jsonl").exists()

    outcome = await run(api, output, {"format": "jsonl", "max_part_bytes": 100})

    assert outcome.written is not None and len(outcome.written) == 3
    assert b"".join(file.path.read_bytes() for file in outcome.written) == fake.lines()
    assert len(fake.submits) == 1  # the rerun followed the same operation
    assert fake.gets["/v3/exports/op_1/result/parts/1"] == 1  # checked in place, not fetched again


async def test_an_empty_result_is_an_empty_file(api: Api, fake: FakeApi, tmp_path: Path) -> None:
    outcome = await run(api, tmp_path / "c1.jsonl", {"format": "jsonl"})
    assert outcome.written is not None and outcome.written[0].path.read_bytes() == b""


async def test_incremental_runs_append_what_is_new_and_a_run_with_nothing_new_succeeds(
    api: Api, fake: FakeApi, tmp_path: Path
) -> None:
    output = tmp_path / "c1.jsonl"
    fake.add(3)
    await run(api, output, {"format": "jsonl"}, incrementally=True)
    fake.add(2)
    await run(api, output, {"format": "jsonl"}, incrementally=True)
    quiet_run = await run(api, output, {"format": "jsonl"}, incrementally=True)

    assert output.read_bytes() == fake.lines()
    assert [body["after_seq"] for body in fake.submits] == [0, 3, 5]
    assert quiet_run.written is not None and quiet_run.written[0].message_count == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c1.jsonl", "c1.jsonl.incremental.json"]


async def test_the_watermark_moves_past_messages_the_request_leaves_out(
    api: Api, fake: FakeApi, tmp_path: Path
) -> None:
    output = tmp_path / "c1.jsonl.gz"
    request = {"format": "jsonl", "compression": "gzip", "senders": ["alice"]}
    fake.add(2)
    await run(api, output, request, incrementally=True)
    fake.add(2, sender="bob")
    await run(api, output, request, incrementally=True)
    fake.add(1)
    await run(api, output, request, incrementally=True)

    assert gzip.decompress(output.read_bytes()) == fake.lines(senders=("alice",))
    assert [body["after_seq"] for body in fake.submits] == [0, 2, 4]


@pytest.mark.parametrize("crash_after", ["append", "commit"])
async def test_a_crash_between_append_and_watermark_save_does_not_duplicate_on_the_rerun(
    api: Api, fake: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_after: str
) -> None:
    output = tmp_path / "c1.jsonl"
    fake.add(3)
    await run(api, output, {"format": "jsonl"}, incrementally=True)
    fake.add(2)
    real = getattr(incremental, crash_after)

    def crashing(*args: Any, **kwargs: Any) -> None:
        if crash_after == "append":
            real(*args, **kwargs)  # appended; the export's state file and the watermark not yet touched
        raise Crash  # for commit: the export's state file is gone, the watermark not saved

    monkeypatch.setattr(incremental, crash_after, crashing)
    with pytest.raises(Crash):
        await run(api, output, {"format": "jsonl"}, incrementally=True)
    monkeypatch.undo()
    assert output.read_bytes() == fake.lines()  # the new lines are in OUTPUT, the watermark still says 3
    assert json.loads(history_path(output).read_text())["pending_next_after_seq"] == 5

    await run(api, output, {"format": "jsonl"}, incrementally=True)

    assert output.read_bytes() == fake.lines()
    assert json.loads(history_path(output).read_text())["next_after_seq"] == 5
    # With its state file still there, the rerun followed the same export; without it, it exported again.
    assert [body["after_seq"] for body in fake.submits] == ([0, 3] if crash_after == "append" else [0, 3, 3])


async def test_a_crash_just_after_the_watermark_save_leaves_nothing_in_the_next_runs_way(
    api: Api, fake: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = tmp_path / "c1.jsonl"
    fake.add(3)
    real = incremental.commit

    def crashing(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        raise Crash

    monkeypatch.setattr(incremental, "commit", crashing)
    with pytest.raises(Crash):
        await run(api, output, {"format": "jsonl"}, incrementally=True)
    monkeypatch.undo()
    fake.add(1)

    await run(api, output, {"format": "jsonl"}, incrementally=True)

    assert output.read_bytes() == fake.lines()
    assert [body["after_seq"] for body in fake.submits] == [0, 3]


def live_line(operation: dict[str, Any]) -> str:
    return LiveLine(Console(file=io.StringIO()), Clock()).line(operation)


def test_the_progress_line_shows_the_share_of_the_estimate_when_there_is_one() -> None:
    operation: dict[str, Any] = {
        "operation_id": "op_1",
        "state": "RUNNING",
        "progress": {"phase": "writing", "messages_written": 250, "bytes_written": 2048},
        "estimate": {"messages_at_most": 1000},
    }
    assert "250 of at most 1,000 messages (25%)" in live_line(operation)
    operation["progress"]["messages_written"] = 1200  # an upper bound: never more than 100 %
    assert "(100%)" in live_line(operation)
    operation["estimate"]["messages_at_most"] = 0
    assert "1,200 of at most 0 messages (100%)" in live_line(operation)
    operation["estimate"]["messages_at_most"] = None
    assert "1,200 messages, 2.0 KiB" in live_line(operation)
    del operation["estimate"]  # an API from before the estimate
    assert "1,200 messages, 2.0 KiB" in live_line(operation)


def test_the_progress_line_shows_the_bytes_an_export_with_media_will_store() -> None:
    operation: dict[str, Any] = {
        "operation_id": "op_1",
        "state": "RUNNING",
        "progress": {"phase": "writing", "messages_written": 3, "bytes_written": 2048},
        "estimate": {"messages_at_most": 10, "bytes": 4 * 1024 * 1024},
    }
    assert ", 2.0 KiB of about 4.0 MiB, " in live_line(operation)
    operation["estimate"]["bytes"] = None
    assert ", 2.0 KiB, " in live_line(operation)
