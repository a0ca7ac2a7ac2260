"""The S3 emulator for development and tests: moto's server mode (``devtools.s3_emulator``) in a child process,
on a port it binds itself (port 0) and reports, unless a port is asked for. ``CHATEXPORT_S3_EMULATOR`` names
the HTTP server under it (``cheroot``, the default, keeps connections alive; ``werkzeug`` is moto's own, which
closes every one: for benchmarks of before)."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from shared.lifecycle import die_with_parent
from shared.settings import local_url

SERVER_ENV = "CHATEXPORT_S3_EMULATOR"
# The HTTP servers ``devtools.s3_emulator`` can put moto behind, the default first.
SERVERS = ("cheroot", "werkzeug")


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


def start_moto(host: str = "127.0.0.1", port: int = 0, *, timeout: float = 30.0) -> MotoServer:
    """Start the S3 emulator (moto's server mode) on ``host:port`` (0: a port it picks) and return once it
    listens, with the port it reported.

    Raises ``RuntimeError`` when it exits or does not report its port within ``timeout`` seconds, and
    ``ValueError`` when ``CHATEXPORT_S3_EMULATOR`` names no server of ``SERVERS``.
    """
    server_name = os.environ.get(SERVER_ENV, SERVERS[0])
    if server_name not in SERVERS:
        raise ValueError(f"{SERVER_ENV}={server_name!r}: expected one of {', '.join(SERVERS)}")
    process = subprocess.Popen(
        [sys.executable, "-m", "devtools.s3_emulator", "-H", host, "-p", str(port), "--server", server_name],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        # A killed `chatexport dev` or test run must not leave the emulator behind.
        preexec_fn=die_with_parent,
    )
    assert process.stdout is not None
    with process.stdout:
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        line = process.stdout.readline() if ready else b""
    if not line.strip().isdigit():
        server = MotoServer(process, local_url(host, port))
        server.stop()
        if ready:
            raise RuntimeError(f"moto server exited with {process.returncode} before it listened")
        raise RuntimeError(f"moto server did not listen within {timeout} s")
    return MotoServer(process, local_url(host, int(line)))


@contextlib.contextmanager
def moto_server(host: str = "127.0.0.1", port: int = 0) -> Iterator[MotoServer]:
    """Context manager around ``start_moto``: the server is stopped on exit."""
    server = start_moto(host, port)
    try:
        yield server
    finally:
        server.stop()
