"""Pieces of ``chatexport dev`` that need no services: URLs, the demo choice and the printed shell snippet."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from devtools import supervisor
from shared.auth import TokenVerifier
from shared.settings import Settings

LINES = b'{"seq":1,"body":"\xe4\xbd\xa0\xe5\xa5\xbd"}\n{"seq":2,"body":"hi"}\n'


class FakeApi(BaseHTTPRequestHandler):
    """Just enough of the export API for the snippet: submit, two polls, download."""

    final_state = "SUCCEEDED"
    polls = 0
    requests: list[tuple[str, str, dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._record(body)
        self._json(202, {"operation_id": "op_demo", "state": "QUEUED"})

    def do_GET(self) -> None:
        self._record(b"")
        if self.path == "/v3/operations/op_demo":
            type(self).polls += 1
            state = "RUNNING" if self.polls == 1 else self.final_state
            self._json(200, {"operation_id": "op_demo", "state": state, "next_poll_after_seconds": 0})
        elif self.path == "/v3/exports/op_demo/result":
            self.send_response(200)
            self.send_header("Content-Length", str(len(LINES)))
            self.end_headers()
            self.wfile.write(LINES)
        else:
            self._json(404, {"code": "NOT_FOUND"})

    def _record(self, body: bytes) -> None:
        self.requests.append((self.command, self.path, dict(self.headers), body))

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def fake_api() -> Iterator[str]:
    FakeApi.polls = 0
    FakeApi.requests = []
    FakeApi.final_state = "SUCCEEDED"
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


needs_tools = pytest.mark.skipif(
    not (shutil.which("curl") and shutil.which("bash") and shutil.which("python3")),
    reason="the snippet needs curl, bash and python3",
)


def run_snippet(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # `; echo still-here` proves that a failing snippet does not end the shell it was pasted into.
    return subprocess.run(
        ["bash", "-c", script + "\necho still-here"], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


@needs_tools
def test_the_demo_snippet_submits_polls_and_downloads(fake_api: str, tmp_path: Path) -> None:
    result = run_snippet(supervisor.demo_script(fake_api, "tok.en.x", "corpus-chinese-greetings"), tmp_path)

    assert result.returncode == 0, result.stderr
    assert (tmp_path / "export.jsonl").read_bytes() == LINES
    assert "state: RUNNING\nstate: SUCCEEDED" in result.stdout
    assert result.stdout.rstrip().endswith("still-here")
    method, path, headers, body = FakeApi.requests[0]
    assert (method, path) == ("POST", "/v3/conversations/corpus-chinese-greetings/exports")
    assert headers["Authorization"] == "Bearer tok.en.x"
    assert headers["Content-Type"] == "application/json"
    assert headers["Idempotency-Key"].startswith("demo-")
    assert json.loads(body) == {"format": "jsonl"}
    assert all(request[2]["Authorization"] == "Bearer tok.en.x" for request in FakeApi.requests)


@needs_tools
def test_the_demo_snippet_stops_on_a_failed_operation_without_downloading(fake_api: str, tmp_path: Path) -> None:
    FakeApi.final_state = "FAILED"
    result = run_snippet(supervisor.demo_script(fake_api, "t", "c-1"), tmp_path)

    assert "state: FAILED" in result.stdout
    assert result.stdout.rstrip().endswith("still-here")
    assert not (tmp_path / "export.jsonl").exists()
    assert [request[1] for request in FakeApi.requests if "result" in request[1]] == []


@pytest.mark.parametrize(
    ("host", "expected"),
    [("127.0.0.1", "http://127.0.0.1:8123"), ("0.0.0.0", "http://127.0.0.1:8123"), ("::1", "http://[::1]:8123")],
)
def test_api_base_url_is_reachable_from_this_machine(host: str, expected: str) -> None:
    assert supervisor.api_base_url(Settings(api_host=host, api_port=8123)) == expected


def test_the_demo_prefers_the_chinese_greetings() -> None:
    assert supervisor._demo_conversation(None) == "corpus-chinese-greetings"
    assert supervisor._demo_conversation(["english", "chinese"]) == "corpus-chinese-greetings"
    assert supervisor._demo_conversation(["english"]) == "corpus-english-ai"  # the first file otherwise


def test_the_printed_example_has_a_token_for_alice() -> None:
    settings = Settings(api_port=8123)
    ports = supervisor.metrics_ports(settings, ["api", "relay", "worker-1", "janitor"])
    text = supervisor._example(settings, "corpus-chinese-greetings", ports)
    assert "export TOKEN='" in text and "http://127.0.0.1:8123" in text
    assert "api :9100, relay :9101, worker-1 :9102, janitor :9103" in text
    assert "curl -s http://127.0.0.1:9103/metrics" in text
    token = text.split("export TOKEN='", 1)[1].split("'", 1)[0]
    assert TokenVerifier(settings).verify(f"Bearer {token}").user_id == "alice"
