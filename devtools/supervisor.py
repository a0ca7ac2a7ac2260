"""``chatexport dev``: every part of the service on one machine, in the foreground, for ``make run``.

Order of start-up: the database (created if missing, then migrated), S3 (a moto server on the port of
``CHATEXPORT_S3_ENDPOINT_URL`` unless something answers there already) and its bucket, then the parts as
child processes ``python -m chatexport.cli api|relay|worker|janitor`` with this process's environment, their
output prefixed with the part's name. Once the API's ``/readyz`` and every other part's ``/healthz`` answer
200 (a part handles SIGTERM from then on), the demo corpus is loaded and a copy-pasteable example is printed.

SIGINT or SIGTERM stops every part (SIGTERM, then SIGKILL after the grace period) and moto, and exits 0;
a second signal skips the grace period. A part that dies is reported and everything is stopped, exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, TextIO
from urllib.parse import urlsplit

from devtools.corpus import ImportSummary, conversation_id_for, corpus_files, import_corpus
from devtools.moto import MotoServer, start_moto
from devtools.processes import ProcessGroup
from shared.auth import mint_token
from shared.db import create_pool
from shared.migrator import migrate_database
from shared.settings import Settings, local_url
from shared.storage import ensure_bucket, open_s3_client

__all__ = ["DevOptions", "ProcessGroup", "run_dev"]

DEMO_USER = "alice"
DEMO_TOKEN_TTL_SECONDS = 12 * 3600
PREFERRED_DEMO = ("chinese", "greetings")
# Added to the parts' own shutdown grace before SIGKILL: interpreter exit and closing connections.
STOP_MARGIN_SECONDS = 5.0
READY_POLL_SECONDS = 0.25


@dataclass(frozen=True)
class DevOptions:
    """What ``chatexport dev`` starts: ``workers`` worker processes, the corpus ``languages`` (None: all)."""

    workers: int = 2
    languages: Sequence[str] | None = None
    load_corpus: bool = True
    ready_timeout: float = 60.0


class ShutdownRequested(Exception):
    """SIGINT or SIGTERM arrived; ``args[0]`` is the signal number."""


class PartDied(Exception):
    """A part ended while it should be running; ``args`` are (name, returncode)."""


class _HurryUp(Exception):
    """A second signal arrived during shutdown: skip the grace period."""


class Console:
    """Line-atomic output shared by the parts' pump threads and the supervisor; ``width`` pads names."""

    def __init__(self, stream: TextIO, width: int) -> None:
        self._stream = stream
        self._width = width
        self._lock = threading.Lock()

    def part_line(self, name: str, line: str) -> None:
        """Print one line a part wrote, prefixed with its name (a ``ProcessGroup`` sink)."""
        self._write(f"{name:<{self._width}} | {line}")

    def say(self, text: str) -> None:
        """Print a supervisor message."""
        self._write(f"{'dev':<{self._width}} | {text}")

    def block(self, text: str) -> None:
        """Print ``text`` unprefixed and uninterrupted by the parts' lines (for copy and paste)."""
        self._write(text)

    def _write(self, text: str) -> None:
        with self._lock:
            self._stream.write(text + "\n")
            self._stream.flush()


class _Signals:
    """SIGINT/SIGTERM raise ``ShutdownRequested`` in the main thread, except inside ``deferred()``."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._deferring = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def hurry_mode(self) -> None:
        """From now on a signal raises ``_HurryUp``: the user does not want to wait for the grace period."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_second_signal)

    def ignore(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Hold a signal back while a child is being started, so none is left half-registered."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        self.check()

    def check(self) -> None:
        if self.received is not None and not self._deferring:
            raise ShutdownRequested(self.received)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        self.check()

    def _on_second_signal(self, signum: int, frame: FrameType | None) -> None:
        raise _HurryUp(signum)


def run_dev(settings: Settings, options: DevOptions, *, stream: TextIO | None = None) -> int:
    """Run everything until a signal (exit code 0) or a failure: a part died or start-up failed (1)."""
    return _DevRun(settings, options, stream or sys.stdout).run()


class _DevRun:
    """One ``chatexport dev``: what it started, so that any exit path can stop exactly that."""

    def __init__(self, settings: Settings, options: DevOptions, stream: TextIO) -> None:
        self.settings = settings
        self.options = options
        self.names = ["api", "relay", *(f"worker-{n}" for n in range(1, options.workers + 1)), "janitor"]
        self.console = Console(stream, width=max(len(name) for name in self.names))
        self.group = ProcessGroup(sink=self.console.part_line)
        self.moto: MotoServer | None = None
        self.signals = _Signals()

    def run(self) -> int:
        self.signals.install()
        try:
            self._start()
            raise PartDied(*self._watch())
        except ShutdownRequested as exc:
            self.console.say(f"{signal.Signals(exc.args[0]).name} received; stopping")
            return 0
        except PartDied as exc:
            self.console.say(f"FAILED: {exc.args[0]} exited with code {exc.args[1]} (see its lines above); stopping")
            return 1
        except Exception as exc:  # start-up failed: say what, then clean up like any other stop
            self.console.say(f"FAILED during start-up: {type(exc).__name__}: {exc}")
            return 1
        finally:
            self._stop_everything()
            self.signals.restore()

    def _start(self) -> None:
        self._prepare_database()
        with self.signals.deferred():
            self.moto = _ensure_s3(self.settings, self.console)
        asyncio.run(_ensure_bucket(self.settings))
        ports = metrics_ports(self.settings, self.names)
        check_ports_free(self.settings, ports)
        for name in self.names:
            env = {**os.environ, "CHATEXPORT_METRICS_PORT": str(ports[name])}
            with self.signals.deferred():  # a signal mid-start would leave a child we do not know about
                self.group.start(name, [sys.executable, "-m", "chatexport.cli", name.split("-")[0]], env)
        self._wait_ready(ports)
        conversation_id = self._load_demo() if self.options.load_corpus else None
        self.console.block(_example(self.settings, conversation_id, ports))

    def _prepare_database(self) -> None:
        created, applied = asyncio.run(migrate_database(self.settings))
        state = "created and migrated" if created else "migrated"
        self.console.say(f"database {state}; applied: {', '.join(applied) or 'nothing (up to date)'}")

    def _wait_ready(self, ports: dict[str, int]) -> None:
        """Poll the API's ``/readyz`` and each other part's ``/healthz`` on its monitoring port (part name to
        port; 0, picked by the part, cannot be polled) until all answer 200, so that every part handles
        SIGTERM once we say it runs. Raises ``PartDied`` if a part ends first, ``TimeoutError`` at the deadline.
        """
        waiting = {"api": f"{api_base_url(self.settings)}/readyz"}
        waiting |= {
            name: f"{local_url(self.settings.metrics_host, port)}/healthz"
            for name, port in ports.items()
            if name != "api" and port
        }
        started = time.monotonic()
        while True:
            waiting = {name: url for name, url in waiting.items() if not _is_ready(url)}
            if not waiting:
                break
            ended = self._ended()
            if ended is not None:
                raise PartDied(*ended)
            if time.monotonic() - started > self.options.ready_timeout:
                raise TimeoutError(
                    f"{', '.join(waiting.values())} did not answer 200 within {self.options.ready_timeout:.0f} s"
                )
            # Wakes early when a part exits; otherwise this is the poll interval.
            self.group.wait_any_exit(timeout=READY_POLL_SECONDS)
        self.console.say(f"api ready at {api_base_url(self.settings)} after {time.monotonic() - started:.1f} s")

    def _ended(self) -> tuple[str, int] | None:
        """(name, returncode) of a part or of our moto server that is no longer running, else None."""
        for name, code in self.group.exited().items():
            return name, code
        if self.moto is not None and self.moto.process.poll() is not None:
            return "moto", self.moto.process.returncode
        return None

    def _watch(self) -> tuple[str, int]:
        """Block until a part or moto ends; return (name, returncode). Signals interrupt it."""
        while True:
            # Parts wake this wait when they end; the timeout only bounds how late moto's end is seen.
            self.group.wait_any_exit(timeout=1.0)
            ended = self._ended()
            if ended is not None:
                return ended

    def _load_demo(self) -> str | None:
        """Import the corpus; return the conversation the example exports (None when nothing was selected)."""

        async def load() -> ImportSummary:
            pool = await create_pool(self.settings)
            try:
                return await import_corpus(pool, languages=self.options.languages)
            finally:
                await pool.close()

        started = time.monotonic()
        summary = asyncio.run(load())
        self.console.say(
            f"demo corpus: {summary.conversations} conversations, {summary.imported} messages imported, "
            f"{summary.skipped} already there ({time.monotonic() - started:.1f} s)"
        )
        return _demo_conversation(self.options.languages)

    def _stop_everything(self) -> None:
        """Stop the parts (SIGTERM; SIGKILL after the grace period, or at once on a second signal), then moto."""
        running = self.group.pids()
        if running:
            self.console.say(f"stopping {', '.join(running)} (a second Ctrl-C or SIGTERM kills them at once)")
        self.signals.hurry_mode()
        try:
            codes = self.group.stop_all(timeout=self.settings.shutdown_grace_seconds + STOP_MARGIN_SECONDS)
        except _HurryUp:
            self.signals.ignore()
            codes = self.group.kill_all()
        self.signals.ignore()  # nothing may interrupt the rest of the cleanup
        if self.moto is not None:
            self.moto.stop()  # after the parts: a draining worker may still talk to S3
        if codes:
            self.console.say("stopped: " + ", ".join(f"{name}={code}" for name, code in codes.items()))


def _ensure_s3(settings: Settings, console: Console) -> MotoServer | None:
    """Start moto on the endpoint's port unless something answers there; None when nothing was started.

    Raises ``RuntimeError`` for an endpoint on another machine that does not answer (we cannot start an
    emulator there) and when moto does not come up.
    """
    endpoint = settings.s3_endpoint_url
    if endpoint is None:
        console.say("S3: the AWS default endpoint (no emulator)")
        return None
    if _answers(endpoint):
        console.say(f"S3: using the server already answering on {endpoint}")
        return None
    parts = urlsplit(endpoint)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise RuntimeError(f"the S3 endpoint {endpoint} does not answer")
    server = start_moto(parts.hostname, parts.port or 80)
    console.say(f"S3: started moto on {server.endpoint_url} (pid {server.process.pid}; in memory only)")
    return server


def _answers(url: str) -> bool:
    """True when an HTTP server answers at ``url``, whatever its status code."""
    try:
        with urllib.request.urlopen(url, timeout=1.0):  # noqa: S310 - the configured endpoint
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


async def _ensure_bucket(settings: Settings) -> None:
    async with open_s3_client(settings) as client:
        await ensure_bucket(client, settings.s3_bucket)


def metrics_ports(settings: Settings, names: Sequence[str]) -> dict[str, int]:
    """Each part's monitoring port on this one host: ``metrics_port``, then the next ones in ``names``
    order (0 stays 0: every part picks a free port and logs it).
    """
    base = settings.metrics_port
    return {name: base + index if base else 0 for index, name in enumerate(names)}


class PortInUse(RuntimeError):
    """A port this system would listen on is taken, most likely by another system already running."""


def check_ports_free(settings: Settings, metrics: dict[str, int]) -> None:
    """Raise ``PortInUse`` naming the setting to change when the API's port or one of the parts' monitoring
    ``metrics`` ports (part name to port) cannot be bound: otherwise the readiness check would take another
    system's API for this one's, and each part would die of the clash after the banner was printed.
    """
    wanted = [(settings.api_host, settings.api_port, "CHATEXPORT_API_PORT")]
    wanted += [(settings.metrics_host, port, "CHATEXPORT_METRICS_PORT") for port in metrics.values()]
    for host, port, setting in wanted:
        if port and not _bindable(host, port):
            raise PortInUse(f"port {port} on {host} is in use (another system?): give this one its own {setting}")


def _bindable(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is no clash
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def api_base_url(settings: Settings) -> str:
    """The URL a local client uses for the API: a wildcard listen address becomes loopback."""
    return local_url(settings.api_host, settings.api_port)


def _is_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:  # noqa: S310 - our own local URL
            return bool(response.status == 200)
    except OSError:  # refused while starting, or an HTTPError such as 503 while not ready
        return False


def _demo_conversation(languages: Sequence[str] | None) -> str | None:
    files = corpus_files(languages)
    if not files:
        return None
    topics = [(language, path.name.removesuffix(".yml")) for language, path in files]
    language, topic = PREFERRED_DEMO if PREFERRED_DEMO in topics else topics[0]
    return conversation_id_for(language, topic)


def _example(settings: Settings, conversation_id: str | None, ports: dict[str, int]) -> str:
    """The text printed once everything is up: URLs, monitoring ports, the client's settings with a token,
    and the client command that exports one conversation.
    """
    token = mint_token(
        settings, user_id=DEMO_USER, ttl_seconds=min(DEMO_TOKEN_TTL_SECONDS, settings.jwt_max_lifetime_seconds)
    )
    base = api_base_url(settings)
    lines = [
        "",
        "=" * 78,
        f"chatexport is running: API {base}, S3 {settings.s3_endpoint_url}, bucket {settings.s3_bucket}",
        "Each part's /metrics, /healthz and /readyz: " + ", ".join(f"{name} :{port}" for name, port in ports.items()),
        f"  e.g. curl -s http://127.0.0.1:{ports['janitor']}/metrics | grep '^chatexport_operations'",
        f"The client's settings, with a token for {DEMO_USER} (12 h):",
        client_settings_line(base, token),
        "More tokens: .venv/bin/chatexport token --sub USER [--admin]. Stop with Ctrl-C.",
        f"The web page (paste the token there): {base}/ui/",
    ]
    if conversation_id is not None:
        lines += [
            f"Then export {conversation_id} as {DEMO_USER} (interrupted, the same command resumes it):",
            client_command_line(conversation_id),
        ]
    lines += ["=" * 78, ""]
    return "\n".join(lines)


def client_settings_line(base_url: str, token: str) -> str:
    """The shell line that gives the client the API's ``base_url`` and ``token``."""
    return f"  export CHATEXPORT_API_URL='{base_url}' CHATEXPORT_TOKEN='{token}'"


def client_command_line(conversation_id: str) -> str:
    """The shell line that exports ``conversation_id`` with the client into ``<conversation_id>.jsonl``."""
    return f"  .venv/bin/chatexport export {conversation_id} -o {conversation_id}.jsonl"
