"""``chatexport dev`` as ``make run`` starts it: everything comes up, the printed client command works, a SIGTERM
stops every process, and a part that dies is reported with a non-zero exit.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from devtools import corpus
from devtools.broker import delete_broker_objects
from devtools.ports import free_port
from devtools.processes import ProcessGroup
from shared.settings import Settings
from tests.support import AMQP_URL, PG_SERVER
from tests.support.api_calls import metric_samples

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 120.0
PARTS = ("api", "relay", "worker-1", "worker-2", "janitor")


def free_port_block(size: int) -> int:
    """The first of ``size`` consecutive ports that are free now (``chatexport dev`` numbers the parts')."""
    for _ in range(100):
        first = free_port()
        if first + size <= 65535 and all(_bindable(first + offset) for offset in range(size)):
            return first
    raise RuntimeError(f"no {size} consecutive free ports")


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def scrape(port: int) -> dict[str, float]:
    """``/metrics`` of the part on ``port`` (see ``metric_samples``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return metric_samples(response.read().decode())


def printed_ports(lines: list[str]) -> dict[str, int]:
    """The monitoring ports from the line ``Each part's /metrics, ...: api :9100, relay :9101, ...``."""
    line = next(line for line in lines if line.startswith("Each part's /metrics"))
    return {name: int(port) for name, port in (item.split(" :") for item in line.split(": ", 1)[1].split(", "))}


@pytest.fixture
async def dev_env() -> AsyncIterator[dict[str, str]]:
    """The environment of one ``chatexport dev``: its own database, broker names, bucket and ports."""
    tag = uuid.uuid4().hex[:10]
    database = f"chatexport_dev_{tag}"
    env = {
        **os.environ,
        "CHATEXPORT_ENVIRONMENT": "development",
        "CHATEXPORT_DATABASE_URL": f"{PG_SERVER}/{database}",  # does not exist yet: dev creates it
        "CHATEXPORT_AMQP_URL": AMQP_URL,
        "CHATEXPORT_AMQP_EXCHANGE": f"chatexport-dev-{tag}",
        "CHATEXPORT_AMQP_QUEUE": f"chatexport-dev-{tag}",
        "CHATEXPORT_S3_BUCKET": f"dev-{tag}",
        "CHATEXPORT_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",  # nothing there: dev starts moto
        "CHATEXPORT_API_PORT": str(free_port()),
        "CHATEXPORT_METRICS_PORT": str(free_port_block(len(PARTS))),
        "CHATEXPORT_SHUTDOWN_GRACE_SECONDS": "5",
    }
    yield env
    await delete_broker_objects(
        Settings(
            amqp_url=AMQP_URL, amqp_exchange=env["CHATEXPORT_AMQP_EXCHANGE"], amqp_queue=env["CHATEXPORT_AMQP_QUEUE"]
        )
    )
    conn = await asyncpg.connect(f"{PG_SERVER}/postgres")
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[ProcessGroup]:
    with ProcessGroup(log_dir=tmp_path / "logs") as processes:
        yield processes


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(") ", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def running(pid: int) -> bool:
    try:
        return not Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].startswith("Z")
    except OSError:
        return False


def assert_figures_moved(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> None:
    """One export went through: every part's own figures moved by what it did for it."""
    grew = {name: {key: value - before[name].get(key, 0.0) for key, value in after[name].items()} for name in after}
    exports = "chatexport_http_requests_total{method=POST,route=/v3/conversations/{cid}/exports,status=202}"
    download = "chatexport_http_requests_total{method=GET,route=/v3/exports/{operation_id}/result,status=200}"
    assert (grew["api"].get(exports), grew["api"].get(download)) == (1, 1)
    assert grew["relay"]["chatexport_relay_published_total{}"] >= 1
    workers = [name for name in after if name.startswith("worker")]
    assert sum(grew[name]["chatexport_worker_exported_bytes_total{}"] for name in workers) > 0
    assert sum(grew[name]["chatexport_worker_attempts_ended_total{outcome=SUCCEEDED}"] for name in workers) == 1
    assert grew["janitor"]["chatexport_operations{state=SUCCEEDED}"] == 1


def client_lines_from(lines: list[str]) -> str:
    """The printed client settings and export command, as one shell script run from a clone's root."""
    settings = next(line for line in lines if line.startswith("  export CHATEXPORT_API_URL="))
    command = next(line for line in lines if line.startswith("  .venv/bin/chatexport export "))
    # The command names the clone's own .venv; the test runs it in a scratch folder with this interpreter's.
    return f"{settings}\n{command.replace('.venv/bin/chatexport', str(Path(sys.executable).parent / 'chatexport'))}"


@pytest.mark.skipif(not shutil.which("bash"), reason="the printed lines are run by bash")
def test_dev_starts_everything_serves_the_example_and_stops_on_sigterm(
    dev_env: dict[str, str], group: ProcessGroup, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "chatexport.cli", "dev", "--workers", "2", "--language", "chinese"]
    dev = group.start("dev", command, dev_env, cwd=REPO)
    # The client's command is the example's last line but the rule.
    group.wait_for_line("dev", lambda line: line.startswith("  .venv/bin/chatexport export "), timeout=START_TIMEOUT)
    parts = children_of(dev.pid)
    names = {Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[-2].decode() for pid in parts}
    assert {"api", "relay", "worker", "janitor"} <= names

    ports = printed_ports(list(dev.tail))
    assert list(ports) == list(PARTS)
    before = {name: scrape(port) for name, port in ports.items()}

    result = subprocess.run(
        ["bash", "-c", client_lines_from(list(dev.tail))], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )

    assert result.returncode == 0, result.stdout + result.stderr
    # The last figures (the download's request count, say) are written just after curl has its last byte.
    deadline = time.monotonic() + 10
    while True:
        after = {name: scrape(port) for name, port in ports.items()}
        try:
            assert_figures_moved(before, after)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)  # polling another process's figures until the deadline
    greetings = corpus.load_file("chinese", corpus.data_dir() / "chinese" / "greetings.yml")
    exported = (tmp_path / "corpus-chinese-greetings.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(exported) == len(greetings.lines)
    assert group.stop("dev", signal.SIGTERM, timeout=60) == 0
    assert [pid for pid in parts if running(pid)] == []
    assert any("SIGTERM received; stopping" in line for line in dev.tail)


def test_dev_reports_a_part_that_dies_and_exits_non_zero(dev_env: dict[str, str], group: ProcessGroup) -> None:
    dev = group.start("dev", [sys.executable, "-m", "chatexport.cli", "dev", "--no-import"], dev_env, cwd=REPO)
    group.wait_for_line("dev", lambda line: "chatexport is running" in line, timeout=START_TIMEOUT)
    os.kill(part_pid("worker", dev_env["CHATEXPORT_AMQP_QUEUE"]), signal.SIGKILL)
    code = group.wait("dev", START_TIMEOUT)

    assert code == 1
    died = [line for line in dev.tail if "FAILED: worker-" in line]
    assert died and died[0].endswith("exited with code -9 (see its lines above); stopping"), died
    stopped = next(line for line in dev.tail if "stopped:" in line)
    codes = dict(item.split("=") for item in stopped.split("stopped: ", 1)[1].split(", "))
    assert set(codes) == set(PARTS) and sorted(codes.values()).count("-9") == 1, codes
    assert set(codes.values()) <= {"0", "-9"}, codes


def test_dev_refuses_a_port_another_system_holds_before_starting_any_part(
    dev_env: dict[str, str], group: ProcessGroup
) -> None:
    port = int(dev_env["CHATEXPORT_API_PORT"])
    with socket.socket() as blocker:  # another system's API
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        dev = group.start("dev", [sys.executable, "-m", "chatexport.cli", "dev", "--no-import"], dev_env, cwd=REPO)
        code = group.wait("dev", START_TIMEOUT)

    assert code == 1
    refusal = f"port {port} on 127.0.0.1 is in use (another system?): give this one its own CHATEXPORT_API_PORT"
    assert any(line.endswith(refusal) for line in dev.tail), list(dev.tail)
    assert not any("ready at" in line or "chatexport is running" in line for line in dev.tail)


def part_pid(part: str, queue: str) -> int:
    """The pid of a running ``chatexport <part>`` whose environment names ``queue`` (one system's own)."""
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            environment = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if command[-2:-1] == [part.encode()] and f"CHATEXPORT_AMQP_QUEUE={queue}".encode() in environment:
            return int(entry.name)
    raise AssertionError(f"no running {part} of queue {queue}")
