"""The whole system as real processes on this machine: moto server, api, relay, workers and janitor,
each started with ``python -m shared.cli <part>`` on its own database, exchange, queue and bucket.

Used by the end-to-end tests and by the benchmark. Processes are driven over HTTP and signals only.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path

from shared.devs3 import MotoServer, free_port, start_moto
from shared.processes import ProcessGroup
from shared.settings import Settings

READY_TIMEOUT_SECONDS = 60.0


class LocalSystem:
    """Starts and stops the parts; ``env`` is the ``CHATEXPORT_*`` environment they all share."""

    def __init__(self, *, database_url: str, amqp_url: str, log_dir: Path, overrides: Mapping[str, str] | None = None):
        self.moto: MotoServer | None = None
        self.api_port = free_port()
        self.base_url = f"http://127.0.0.1:{self.api_port}"
        tag = uuid.uuid4().hex[:10]
        self.env: dict[str, str] = {
            **os.environ,
            "CHATEXPORT_DATABASE_URL": database_url,
            "CHATEXPORT_AMQP_URL": amqp_url,
            "CHATEXPORT_AMQP_EXCHANGE": f"chatexport-e2e-{tag}",
            "CHATEXPORT_AMQP_QUEUE": f"chatexport-e2e-{tag}",
            "CHATEXPORT_S3_BUCKET": f"e2e-{tag}",
            "CHATEXPORT_API_PORT": str(self.api_port),
            "CHATEXPORT_LOG_LEVEL": "INFO",
            **(overrides or {}),
        }
        self.group = ProcessGroup(log_dir=log_dir)

    def start(self, *, workers: int = 2) -> None:
        """Start moto, then every part; return once the API answers ``/readyz``. Raises ``RuntimeError``."""
        self.start_storage()
        self.start_parts(workers=workers)

    def start_storage(self) -> MotoServer:
        """Start this system's own moto server; the parts use it unless ``env`` is changed before they start."""
        self.moto = start_moto()
        self.group.adopt("moto", self.moto.process)
        self.env["CHATEXPORT_S3_ENDPOINT_URL"] = self.moto.endpoint_url
        return self.moto

    def start_parts(self, *, workers: int = 2) -> None:
        """Start api, relay, ``workers`` workers (``worker-1``...) and janitor; wait for ``/readyz``."""
        self.start_part("api")
        self.start_part("relay")
        for number in range(1, workers + 1):
            self.start_part("worker", name=f"worker-{number}")
        self.start_part("janitor")
        self.wait_ready()

    def start_part(self, part: str, *, name: str | None = None) -> None:
        """Start (or restart) one part as ``python -m shared.cli <part>``."""
        self.group.start(name or part, [sys.executable, "-m", "shared.cli", part], self.env)

    def holder(self, lease_owner: str) -> str:
        """The name of the part whose process holds a lease (``lease_owner`` is ``<host>:<pid>``)."""
        pid = int(lease_owner.rsplit(":", 1)[1])
        for name, part_pid in self.group.pids().items():
            if part_pid == pid:
                return name
        raise LookupError(f"no running part has pid {pid}")

    def run_cli(self, *args: str, timeout: float = 300.0) -> str:
        """Run ``chatexport <args>`` to completion with the system's environment; return its output."""
        name = f"cli-{uuid.uuid4().hex[:6]}"
        self.group.start(name, [sys.executable, "-m", "shared.cli", *args], self.env)
        code = self.group.wait(name, timeout)
        part = self.group.part(name)
        if part.pump is not None:
            part.pump.join(5)  # the rest of its output
        output = "\n".join(part.tail)
        if code != 0:
            raise RuntimeError(f"chatexport {' '.join(args)} exited {code}: {output[-2000:]}")
        return output

    def wait_ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        """Poll the API's ``/readyz`` until 200; raises ``RuntimeError`` if a part dies or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.group.exited():
                raise RuntimeError(f"a part died during start-up: {self.group.exited()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/readyz", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)  # polling another process's readiness
        raise RuntimeError("the API did not become ready")

    def settings(self) -> Settings:
        """The settings every part runs with."""
        names = {key.removeprefix("CHATEXPORT_").lower(): value for key, value in self.env.items()}
        return Settings.model_validate({key: value for key, value in names.items() if key in Settings.model_fields})

    def stop(self) -> dict[str, int]:
        """SIGTERM every part, SIGKILL what is left after the grace period; return the exit codes."""
        return self.group.stop_all(timeout=20)
