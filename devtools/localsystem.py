"""The whole system as real processes on this machine, started the way ``deploy/compose.yaml`` starts it.

The compose file is the source. Its one-shot services (``migrate``) run to completion first; then every
long-running service of the project's own image runs with the file's ``command`` (the image's
``chatexport`` is this interpreter's ``-m chatexport.cli``), the file's ``environment`` and the file's replica
count, each replica a local process: ``worker-1``, ``worker-2``... for a service run as several, the
service's own name (``api``, ``relay``) for one. The three infrastructure images are replaced by what runs
here (the test's PostgreSQL database, the local RabbitMQ, a moto server of the system's own) by overriding
exactly the settings that point at them; every process gets a monitoring port and each api process an API
port, all on 127.0.0.1, as listening sockets the system binds (port 0: the kernel picks) and hands to the
process (``CHATEXPORT_API_SOCKET_FD``, ``CHATEXPORT_METRICS_SOCKET_FD``), and holds for as long as it runs,
so that a restarted process serves on the same port and no other process can take it meanwhile (connections
wait in the socket's queue while nothing serves it); the test's overrides come last. The file requires
``CHATEXPORT_JWT_SECRET``: the system supplies a random one, so tokens are minted with ``settings()``.

A system may run another release of the project (``devtools.releases``): its processes then run that
release's interpreter in its worktree, from its own compose file. One started ``beside`` another shares its
database, broker names, bucket, moto server and secrets, as two releases do during an upgrade; a release
that does not take handed sockets binds ports reserved for it (``devtools.ports``).

Used by the end-to-end tests, the fault-injection tests, the upgrade tests and the benchmark. Processes are driven
over HTTP and signals only; ``devtools.broker.delete_broker_objects(system.settings())`` removes the system's
queues and exchanges once it has stopped.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from devtools.compose import COMPOSE_FILE, SETTINGS_PREFIX, Service, load_compose, parts, settings_from_environment
from devtools.compose import one_shots as one_shot_services
from devtools.moto import MotoServer, start_moto
from devtools.ports import free_port
from devtools.processes import ProcessGroup
from devtools.releases import Release
from shared.settings import Settings

LOCAL_HOST = "127.0.0.1"
READY_TIMEOUT_SECONDS = 60.0
READY_POLL_SECONDS = 0.1
ONE_SHOT_TIMEOUT_SECONDS = 300.0
JWT_SECRET_BYTES = 48
LISTEN_BACKLOG = 128  # connections that wait while a process restarts
DEATH_TAIL_LINES = 30  # of a part that died during start-up, in the error
# An operator runs a tool as `docker compose run --rm migrate chatexport <command>`.
CLI_SERVICE = "migrate"
# In place of the minio service's credentials: moto accepts any, these are the ones its documentation uses.
MOTO_CREDENTIALS = {"CHATEXPORT_S3_ACCESS_KEY_ID": "testing", "CHATEXPORT_S3_SECRET_ACCESS_KEY": "testing"}


class LocalSystem:
    """Starts and stops the compose file's services as local processes.

    ``env`` holds the ``CHATEXPORT_*`` values laid over the file's environment of every service: the
    replacements for the infrastructure and the test's ``overrides``; a change affects processes started
    afterwards. ``metrics_ports`` maps each process name to its monitoring port; ``base_url`` is the API of
    the process called ``api`` (``api_url`` names another's).
    """

    def __init__(
        self,
        *,
        database_url: str,
        amqp_url: str,
        log_dir: Path,
        overrides: Mapping[str, str] | None = None,
        release: Release | None = None,
        beside: LocalSystem | None = None,
    ):
        self.release = release
        if beside is None:
            secret, webhook_key = secrets.token_urlsafe(JWT_SECRET_BYTES), secrets.token_urlsafe(JWT_SECRET_BYTES)
            self._variables = {"CHATEXPORT_JWT_SECRET": secret, "CHATEXPORT_WEBHOOK_SIGNING_KEY": webhook_key}
        else:
            self._variables = dict(beside._variables)
        compose = COMPOSE_FILE if release is None else release.root / "deploy" / COMPOSE_FILE.name
        self.services = load_compose(compose, variables={**os.environ, **self._variables})
        self.moto: MotoServer | None = None if beside is None else beside.moto
        # (kind, process name) -> the listening socket handed to every process of that name ("api", "metrics")
        self._sockets: dict[tuple[str, str], socket.socket] = {}
        # The same, for a release that binds its own ports: the reserved port
        self._ports: dict[tuple[str, str], int] = {}
        self.base_url = self.api_url("api")
        tag = uuid.uuid4().hex[:10]
        shared = {
            # The broker and the moto server may be shared with other tests: names of this system's own.
            "CHATEXPORT_AMQP_EXCHANGE": f"chatexport-e2e-{tag}",
            "CHATEXPORT_AMQP_QUEUE": f"chatexport-e2e-{tag}",
            "CHATEXPORT_S3_BUCKET": f"e2e-{tag}",
        }
        self.env: dict[str, str] = {
            **(shared if beside is None else beside.env),
            "CHATEXPORT_DATABASE_URL": database_url,
            "CHATEXPORT_AMQP_URL": amqp_url,
            # Every process shares one host here: loopback only, and a port each (monitoring: start_part).
            "CHATEXPORT_API_HOST": LOCAL_HOST,
            "CHATEXPORT_API_PORT": str(self._port("api", "api")),
            "CHATEXPORT_METRICS_HOST": LOCAL_HOST,
            **(overrides or {}),
        }
        # A container sees only what the file passes: no CHATEXPORT_* of the shell that runs the tests.
        self._inherited = {key: value for key, value in os.environ.items() if not key.startswith(SETTINGS_PREFIX)}
        self.log_dir = log_dir  # <process name>.log for every process
        self.group = ProcessGroup(log_dir=log_dir)
        self.metrics_ports: dict[str, int] = {}
        self._services_of: dict[str, str] = {}  # process name -> its compose service, for restart_ended

    def start(self, *, workers: int | None = None, janitors: int | None = None) -> None:
        """``start_storage()``, then ``start_parts(...)``. Raises ``RuntimeError``."""
        self.start_storage()
        self.start_parts(workers=workers, janitors=janitors)

    def start_storage(self, moto: MotoServer | None = None) -> MotoServer:
        """Start this system's own moto server in place of the ``minio`` service, or use ``moto``, which the
        caller stops; the parts use it unless ``env`` is changed before they start.
        """
        if moto is None:
            self.moto = start_moto()
            self.group.adopt("moto", self.moto.process)
        else:
            self.moto = moto
        # Clients on this machine reach moto itself, so download redirects are signed for it too.
        endpoint = self.moto.endpoint_url
        self.env.update(
            {"CHATEXPORT_S3_ENDPOINT_URL": endpoint, "CHATEXPORT_S3_PUBLIC_ENDPOINT_URL": endpoint, **MOTO_CREDENTIALS}
        )
        return self.moto

    def start_parts(self, *, workers: int | None = None, janitors: int | None = None, one_shots: bool = True) -> None:
        """Run the file's one-shot services to completion (unless not ``one_shots``: the migrations were run
        apart), then start every replica of every part and wait until each one is ready. ``workers`` and
        ``janitors`` replace the file's replica counts (0: none).

        Raises ``RuntimeError`` when storage was not started, a one-shot fails, or a part dies or is not
        ready within ``READY_TIMEOUT_SECONDS``.
        """
        if self.moto is None:
            raise RuntimeError("start_storage() first: the file's S3 endpoint is a container")
        for service in one_shot_services(self.services) if one_shots else []:
            self._complete(service.name, service.command, self.environment(service.name), ONE_SHOT_TIMEOUT_SECONDS)
        counts = {"worker": workers, "janitor": janitors}
        names = []
        for service in parts(self.services):
            for name in replica_names(service, counts.get(service.name)):
                self.start_part(service.name, name=name)
                names.append(name)
        self.wait_ready(names)

    def start_part(self, part: str, *, name: str | None = None, extra_env: Mapping[str, str] | None = None) -> None:
        """Start (or restart) one process of the file's service ``part``, called ``name`` (default: ``part``),
        on the monitoring socket (and, for an api, the API socket) of that name, with ``extra_env`` laid over
        its environment for this process only. Raises ``ValueError`` when a process of that name is running.
        """
        name = name or part
        kinds = ["metrics", "api"] if part == "api" else ["metrics"]
        self.metrics_ports[name] = self._port("metrics", name)
        env = {**self.environment(part), **(extra_env or {})}
        pass_fds = []
        for kind in kinds:
            env[f"CHATEXPORT_{kind.upper()}_PORT"] = str(self._port(kind, name))
            if self._takes_sockets:
                sock = self._socket(kind, name)
                env[f"CHATEXPORT_{kind.upper()}_SOCKET_FD"] = str(sock.fileno())
                pass_fds.append(sock.fileno())
        self._services_of[name] = part
        root = None if self.release is None else self.release.root
        self.group.start(name, self._command(self.services[part].command), env, cwd=root, pass_fds=pass_fds)

    def restart_ended(self) -> list[str]:
        """Start again every long-running process that has ended (killed, stopped), with its settings of
        before, and wait until each is ready; return their names. Raises ``RuntimeError`` as ``wait_ready``.
        """
        ended = [name for name in self.group.exited() if name in self._services_of]
        for name in ended:
            self.start_part(self._services_of[name], name=name)
        self.wait_ready(ended)
        return ended

    def api_url(self, name: str) -> str:
        """The base URL of the api process called ``name`` (its port is taken now if it was not yet)."""
        return f"http://{LOCAL_HOST}:{self._port('api', name)}"

    @property
    def _takes_sockets(self) -> bool:
        return self.release is None or self.release.takes_sockets

    def _port(self, kind: str, name: str) -> int:
        """The port of ``kind`` for the process ``name``: its handed socket's, or one reserved for a release that
        binds its own."""
        if self._takes_sockets:
            port: int = self._socket(kind, name).getsockname()[1]
            return port
        if (kind, name) not in self._ports:
            self._ports[kind, name] = free_port(LOCAL_HOST)
        return self._ports[kind, name]

    def _socket(self, kind: str, name: str) -> socket.socket:
        """The listening socket of ``kind`` for the process ``name``: bound to port 0 on first use, then kept."""
        if (kind, name) not in self._sockets:
            self._sockets[kind, name] = socket.create_server((LOCAL_HOST, 0), backlog=LISTEN_BACKLOG)
        return self._sockets[kind, name]

    def environment(self, service: str) -> dict[str, str]:
        """The complete environment of a process of ``service``: this process's (without its
        ``CHATEXPORT_*``), then the file's for the service, then ``env``.
        """
        return {**self._inherited, **self.services[service].environment, **self.env}

    def holder(self, lease_owner: str) -> str:
        """The name of the part whose process holds a lease (``lease_owner`` is ``<host>:<pid>``)."""
        pid = int(lease_owner.rsplit(":", 1)[1])
        for name, part_pid in self.group.pids().items():
            if part_pid == pid:
                return name
        raise LookupError(f"no running part has pid {pid}")

    def run_cli(self, *args: str, timeout: float = 300.0) -> str:
        """Run ``chatexport <args>`` to completion as ``docker compose run --rm migrate`` would; return its
        output. Raises ``RuntimeError`` when it exits non-zero, ``TimeoutError`` after ``timeout`` seconds.
        """
        name = f"cli-{uuid.uuid4().hex[:6]}"
        return self._complete(name, ["chatexport", *args], self.environment(CLI_SERVICE), timeout)

    def _command(self, command: Sequence[str]) -> list[str]:
        """The file's command as this system's release runs it (``local_command``)."""
        local = local_command(command)
        return local if self.release is None else [str(self.release.python), *local[1:]]

    def wait_ready(self, names: Sequence[str] | None = None, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        """Poll the monitoring ``/readyz`` of every part in ``names`` (default: every running part) until
        each has answered 200. Raises ``RuntimeError`` when one of them ends first or time runs out.
        """
        running = self.group.pids()
        pending = list(names) if names is not None else [name for name in self.metrics_ports if name in running]
        deadline = time.monotonic() + timeout
        while True:
            ended = {name: code for name, code in self.group.exited().items() if name in pending}
            if ended:
                raise RuntimeError(f"parts died during start-up: {ended}\n{self._last_words(ended)}")
            reasons = {name: reason for name in pending if (reason := _unready(self.metrics_ports[name]))}
            if not reasons:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"parts not ready within {timeout} s: {reasons}")
            pending = list(reasons)
            time.sleep(READY_POLL_SECONDS)  # polling other processes' readiness

    def settings(self, service: str = "api") -> Settings:
        """The settings a process of ``service`` runs with (the file gives every part the same ones)."""
        return settings_from_environment(self.environment(service))

    def stop(self) -> dict[str, int]:
        """SIGTERM every process, SIGKILL what is left after the longest ``stop_grace_period`` of the file's
        parts (as compose does), then close the listening sockets; return the exit codes.
        """
        codes = self.group.stop_all(timeout=max(service.stop_grace_seconds for service in parts(self.services)))
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()
        return codes

    def _last_words(self, names: Iterable[str], lines: int = DEATH_TAIL_LINES) -> str:
        """The last ``lines`` lines each part in ``names`` printed, for an error message."""
        return "\n".join(f"--- {name}:\n" + "\n".join(list(self.group.part(name).tail)[-lines:]) for name in names)

    def _complete(self, name: str, command: Sequence[str], env: Mapping[str, str], timeout: float) -> str:
        root = None if self.release is None else self.release.root
        self.group.start(name, self._command(command), env, cwd=root)
        code = self.group.wait(name, timeout)
        part = self.group.part(name)
        if part.pump is not None:
            part.pump.join(5)  # the rest of its output
        output = "\n".join(part.tail)
        if code != 0:
            raise RuntimeError(f"{' '.join(command)} exited {code}: {output[-2000:]}")
        return output


def replica_names(service: Service, count: int | None = None) -> list[str]:
    """Process names for ``count`` replicas of ``service`` (default: the file's count): the service's name
    for one, ``<name>-1``, ``<name>-2``... for several.
    """
    count = (service.replicas or 1) if count is None else count
    return [service.name] if count == 1 else [f"{service.name}-{number}" for number in range(1, count + 1)]


def local_command(command: Sequence[str]) -> list[str]:
    """The file's command for this machine: the image's ``chatexport`` is ``python -m chatexport.cli`` here.

    Raises ``ValueError`` for a command that does not start with ``chatexport``.
    """
    if not command or command[0] != "chatexport":
        raise ValueError(f"not a chatexport command: {list(command)}")
    return [sys.executable, "-m", "chatexport.cli", *command[1:]]


def _unready(port: int) -> str | None:
    """None when the monitoring endpoint on ``port`` answers ``/readyz`` with 200; else why not."""
    try:
        with urllib.request.urlopen(f"http://{LOCAL_HOST}:{port}/readyz", timeout=1):
            return None
    except urllib.error.HTTPError as exc:
        with exc:
            return f"{exc.code} {exc.read(300).decode(errors='replace')}"
    except OSError as exc:  # refused while the part starts
        return f"unreachable ({exc})"
