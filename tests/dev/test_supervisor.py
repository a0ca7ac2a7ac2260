"""Pieces of ``chatexport dev`` that need no services: URLs, the demo choice and the printed client lines."""

from __future__ import annotations

import asyncio
import io
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from devtools import supervisor
from shared.auth import TokenVerifier
from shared.settings import Settings


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


def test_the_printed_example_sets_up_the_client_for_alice() -> None:
    settings = Settings(api_port=8123)
    ports = supervisor.metrics_ports(settings, ["api", "relay", "worker-1", "janitor"])
    text = supervisor._example(settings, "corpus-chinese-greetings", ports)
    assert "api :9100, relay :9101, worker-1 :9102, janitor :9103" in text
    assert "curl -s http://127.0.0.1:9103/metrics" in text
    lines = text.splitlines()
    settings_line = next(line for line in lines if line.startswith("  export CHATEXPORT_API_URL="))
    assert "CHATEXPORT_API_URL='http://127.0.0.1:8123' CHATEXPORT_TOKEN='" in settings_line
    token = settings_line.split("CHATEXPORT_TOKEN='", 1)[1].split("'", 1)[0]
    assert asyncio.run(TokenVerifier(settings).verify(f"Bearer {token}")).user_id == "alice"
    assert "The web page (paste the token there): http://127.0.0.1:8123/ui/" in lines
    command = lines[lines.index(settings_line) + 4]
    assert command == "  .venv/bin/chatexport export corpus-chinese-greetings -o corpus-chinese-greetings.jsonl"


@pytest.mark.parametrize("taken", ["api", "worker-2"])
def test_a_port_another_system_holds_is_refused_before_anything_starts(taken: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        settings = Settings(api_port=port if taken == "api" else 0, metrics_port=0)
        ports = {"api": 0, "worker-1": 0, "worker-2": port if taken != "api" else 0}
        setting = "CHATEXPORT_API_PORT" if taken == "api" else "CHATEXPORT_METRICS_PORT"
        with pytest.raises(supervisor.PortInUse, match=f"port {port} .* own {setting}"):
            supervisor.check_ports_free(settings, ports)
    supervisor.check_ports_free(settings, ports)  # free again once the holder is gone


class _Answers200(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answering_port() -> Iterator[int]:
    """A port on 127.0.0.1 (bound as port 0) where every GET gets 200."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers200)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_the_system_is_not_called_running_before_every_part_answers(answering_port: int) -> None:
    with socket.socket() as silent:  # bound, never listening: connections to it are refused
        silent.bind(("127.0.0.1", 0))
        silent_port = silent.getsockname()[1]
        settings = Settings(api_port=answering_port, metrics_port=0)
        run = supervisor._DevRun(settings, supervisor.DevOptions(ready_timeout=0.5), io.StringIO())
        with pytest.raises(TimeoutError, match=f"http://127.0.0.1:{silent_port}/healthz did not answer"):
            run._wait_ready({"api": 0, "worker-1": answering_port, "janitor": silent_port})
        run._wait_ready({"api": 0, "worker-1": answering_port, "janitor": answering_port, "relay": 0})
