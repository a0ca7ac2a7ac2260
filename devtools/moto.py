"""The S3 emulator for development and tests: moto's server mode (``devtools.s3_emulator``) in a child process on a
free port."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

from devtools.ports import free_port
from shared.lifecycle import die_with_parent


@dataclass
class MotoServer:
    """A running ``moto_server`` child process; ``endpoint_url`` is its base URL."""

    process: subprocess.Popen[bytes]
    endpoint_url: str

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the server and wait up to ``timeout`` seconds, then kill it."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_moto(host: str = "127.0.0.1", port: int | None = None, *, timeout: float = 30.0) -> MotoServer:
    """Start the S3 emulator (moto's server mode) on ``host:port`` (a free port when None) and wait until it answers.

    Raises ``RuntimeError`` when it exits or does not answer within ``timeout`` seconds.
    """
    port = port or free_port(host)
    process = subprocess.Popen(
        [sys.executable, "-m", "devtools.s3_emulator", "-H", host, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # A killed `chatexport dev` or test run must not leave the emulator behind.
        preexec_fn=die_with_parent,
    )
    server = MotoServer(process, f"http://{host}:{port}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited with {process.returncode}")
        if _answers(server.endpoint_url):
            return server
        time.sleep(0.05)  # polling a child process's readiness, not synchronising our own work
    server.stop()
    raise RuntimeError(f"moto server did not answer on {server.endpoint_url} within {timeout} s")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):  # noqa: S310 - our own local URL
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


@contextlib.contextmanager
def moto_server(host: str = "127.0.0.1", port: int | None = None) -> Iterator[MotoServer]:
    """Context manager around ``start_moto``: the server is stopped on exit."""
    server = start_moto(host, port)
    try:
        yield server
    finally:
        server.stop()
