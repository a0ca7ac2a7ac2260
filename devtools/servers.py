"""Private servers for fault-injection tests: a PostgreSQL cluster and a RabbitMQ node that a test may stop,
crash and restart, and a TCP proxy that can cut a server off or slow it down.

Each server lives in its own temporary folder (data, socket, log) and listens on a free port of 127.0.0.1
that stays the same across restarts. Their methods block; from async code call them as
``await asyncio.to_thread(server.stop)``, so the test's event loop keeps running meanwhile.

Server processes are always spawned from one long-lived helper thread with ``die_with_parent``: they get
SIGTERM when the test process ends, even when it is SIGKILLed, whichever thread called ``start``.

All timeouts are in seconds. Failures raise ``ServerError`` with the server's log tail.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import glob
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import aio_pika
import asyncpg

from devtools.ports import free_port
from shared.lifecycle import die_with_parent

HOST = "127.0.0.1"
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 30.0
COMMAND_TIMEOUT_SECONDS = 60.0  # one psql or rabbitmqctl run
POLL_SECONDS = 0.05
PROBE_TIMEOUT_SECONDS = 2.0  # one connection attempt while waiting for a server
LOG_TAIL_BYTES = 6000

T = TypeVar("T")

# One thread that lives as long as the process: the parent-death signal of a child is tied to the thread
# that forked it, so children of a short-lived thread (asyncio.to_thread's) would be killed with it.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="private-server-spawner")


class ServerError(RuntimeError):
    """A private server could not be set up, started or stopped; the message ends with its log tail."""


def _deadline(timeout: float) -> float:
    return time.monotonic() + timeout


def _free_port_other_than(*taken: int) -> int:
    """A free TCP port on 127.0.0.1 that is not one of ``taken``."""
    while (port := free_port(HOST)) in taken:
        pass
    return port


def _tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``path`` as text; empty when the file does not exist."""
    try:
        with path.open("rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - limit))
            return file.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def _listening(port: int) -> bool:
    """True when a TCP connection to ``127.0.0.1:port`` is accepted."""
    try:
        socket.create_connection((HOST, port), timeout=PROBE_TIMEOUT_SECONDS).close()
    except OSError:
        return False
    return True


def _succeeds(make_attempt: Callable[[], Coroutine[Any, Any, object]]) -> bool:
    """Run the coroutine on a private event loop in a helper thread (so it also works from a thread that runs
    a loop); True when it finishes within ``PROBE_TIMEOUT_SECONDS`` without raising.
    """

    async def bounded() -> None:
        await asyncio.wait_for(make_attempt(), PROBE_TIMEOUT_SECONDS)

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="private-server-probe") as pool:
        try:
            pool.submit(asyncio.run, bounded()).result()
        except Exception:  # any failure means "not ready yet"; the caller's deadline bounds the retries
            return False
    return True


class _ChildServer:
    """A server run as one child process (plus its own children), with a temp folder and a log file.

    Subclasses provide ``stop``, ``_command``, ``_accepts_connections`` and optionally ``_environment``,
    ``_prepare`` and ``_stop_quickly``.
    """

    kind = "server"

    def __init__(self, prefix: str) -> None:
        self.base_dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.log_path = self.base_dir / "server.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        """True while the server process started by ``start`` has not exited."""
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The pid of the process ``start`` spawned (RabbitMQ's Erlang VM itself; for PostgreSQL run as root,
        ``runuser``), or None before the first start.
        """
        return None if self._process is None else self._process.pid

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        """The end of the server's log (all its runs, appended)."""
        return _tail(self.log_path, limit)

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> None:
        """Start the server and wait until a client connection succeeds; a running server is left alone.

        Raises ``ServerError`` (with the log tail) when it exits or is not ready within ``timeout`` seconds;
        the process is killed in that case.
        """
        if self.running:
            return
        self._prepare()
        self._spawn(self._command(), self._environment())
        try:
            self._wait_ready(_deadline(timeout))
        except BaseException:
            self._kill()
            raise

    def restart(self, timeout: float = START_TIMEOUT_SECONDS) -> None:
        """``stop()`` then ``start(timeout)``: same port, same data."""
        self.stop()
        self.start(timeout)

    def destroy(self, keep_log_as: Path | None = None) -> None:
        """Stop the server the quick way (its data is thrown away) and delete its folder, after copying its log
        to ``keep_log_as`` when given; safe to call twice.
        """
        try:
            self._stop_quickly()
        finally:
            self._kill()
            if keep_log_as is not None and self.log_path.exists():
                shutil.copyfile(self.log_path, keep_log_as)
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def stop(self) -> None:
        raise NotImplementedError

    def _stop_quickly(self) -> None:
        self.stop()

    def _prepare(self) -> None:
        """Runs before every start (first-time set-up such as ``initdb``)."""

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _environment(self) -> Mapping[str, str] | None:
        return None

    def _accepts_connections(self) -> bool:
        raise NotImplementedError

    def _spawn(self, args: Sequence[str], env: Mapping[str, str] | None) -> None:
        self._process = _SPAWNER.submit(self._popen, args, env).result()

    def _popen(self, args: Sequence[str], env: Mapping[str, str] | None) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as log:
            return subprocess.Popen(
                list(args),
                env=env,
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: _kill reaches its children too
                preexec_fn=die_with_parent,
            )

    def _wait_ready(self, deadline: float) -> None:
        while not self._accepts_connections():
            if not self.running:
                raise self._error("exited during start-up")
            if time.monotonic() > deadline:
                raise self._error("did not accept connections in time")
            time.sleep(POLL_SECONDS)

    def _terminate(self, pid: int, sig: int, timeout: float) -> None:
        """Send ``sig`` to ``pid``, wait up to ``timeout`` seconds for our process to exit, else SIGKILL it."""
        assert self._process is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill()

    def _kill(self) -> None:
        """SIGKILL the server's whole process group and reap it."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:  # once reaped, its pid and group id may belong to someone else
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def _error(self, what: str) -> ServerError:
        code = None if self._process is None else self._process.poll()
        return ServerError(f"{self.kind} in {self.base_dir} {what} (exit code {code}); log tail:\n{self.log_tail()}")


# --- PostgreSQL -------------------------------------------------------------------------------------------

PostgresStopMode = Literal["smart", "fast", "immediate"]
_POSTGRES_STOP_SIGNALS: dict[str, int] = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}
_POSTGRES_SETTINGS = {
    "listen_addresses": HOST,
    "fsync": "off",  # the OS keeps what a crashed server wrote: only a machine crash would lose it
    "full_page_writes": "off",
    "wal_level": "minimal",
    "max_wal_senders": "0",
    "shared_buffers": "32MB",
    "max_connections": "100",
    "logging_collector": "off",
}


def postgres_bindir() -> Path:
    """The folder holding ``initdb`` and ``postgres``: ``pg_config --bindir``, else the newest
    ``/usr/lib/postgresql/<version>/bin``. Raises ``ServerError`` when none is found.
    """
    candidates: list[Path] = []
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        candidates.append(Path(subprocess.check_output(["pg_config", "--bindir"], text=True).strip()))
    found = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += [Path(path) for path in sorted(found, key=_version_key, reverse=True)]
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "postgres").is_file():
            return folder
    raise ServerError(f"no PostgreSQL server binaries found (looked in {[str(c) for c in candidates]})")


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(number) for number in re.findall(r"\d+", path))


def _as_postgres(args: Sequence[str]) -> list[str]:
    """``args`` run as the ``postgres`` OS user when we are root (initdb and postgres refuse root)."""
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else list(args)


class PrivatePostgres(_ChildServer):
    """A throwaway PostgreSQL cluster on ``127.0.0.1:<port>``, trust authentication, superuser ``postgres``.

    The first ``start`` runs ``initdb``, unless ``data_dir`` was filled before (``base_backup_of``). The
    server runs as the ``postgres`` OS user (through ``runuser`` when we are root) with ``fsync=off``: fast,
    and still durable against a server crash. ``settings`` (PostgreSQL parameter name to value) override
    the defaults (``wal_level=minimal``, no WAL senders, ...); they are given on the command line, so they
    win over ``ALTER SYSTEM``: leave out any parameter that must be changed at run time.
    """

    kind = "PostgreSQL"

    def __init__(self, *, settings: Mapping[str, str] | None = None) -> None:
        self.bindir = postgres_bindir()  # before the temp folder exists: nothing to clean up if it fails
        super().__init__("chatexport-pg-")
        self.port = free_port(HOST)
        self.data_dir = self.base_dir / "data"
        self.settings = {**_POSTGRES_SETTINGS, **(settings or {})}
        if os.geteuid() == 0:
            shutil.chown(self.base_dir, user="postgres", group="postgres")

    @property
    def server_url(self) -> str:
        """``postgresql://postgres@127.0.0.1:<port>``, without a database name."""
        return f"postgresql://postgres@{HOST}:{self.port}"

    def url(self, dbname: str = "postgres") -> str:
        """The URL of database ``dbname`` on this server."""
        return f"{self.server_url}/{dbname}"

    async def create_database(self, dbname: str) -> str:
        """Create the empty database ``dbname`` and return its URL (a coroutine: it only talks SQL)."""
        conn = await asyncpg.connect(self.url("postgres"))
        try:
            await conn.execute(f'CREATE DATABASE "{dbname}"')
        finally:
            await conn.close()
        return self.url(dbname)

    def base_backup_of(
        self, primary: PrivatePostgres, *, application_name: str, timeout: float = START_TIMEOUT_SECONDS
    ) -> None:
        """Fill this (never started) server's data folder with ``pg_basebackup -R`` from the running
        ``primary``, so that it starts as a standby streaming from it under ``application_name`` (the name
        ``synchronous_standby_names`` lists). ``primary`` needs ``wal_level=replica`` and WAL senders.

        Raises ``ServerError`` when the backup fails or takes longer than ``timeout`` seconds.
        """
        conninfo = f"host={HOST} port={primary.port} user=postgres application_name={application_name}"
        backup = [str(self.bindir / "pg_basebackup"), "-d", conninfo, "-D", str(self.data_dir), "-R"]
        backup += ["--checkpoint=fast", "--no-sync"]  # fsync is off on these servers anyway
        try:
            result = subprocess.run(_as_postgres(backup), capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ServerError(f"pg_basebackup from port {primary.port} took over {timeout} s") from exc
        if result.returncode != 0:
            raise ServerError(f"pg_basebackup failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")

    def query(self, sql: str, *, dbname: str = "postgres", timeout: float = COMMAND_TIMEOUT_SECONDS) -> str:
        """Run ``sql`` with ``psql`` (blocking, for code without an event loop) and return its output
        unaligned, without headers: one line a row, ``|`` between columns.

        Raises ``ServerError`` when psql fails or takes longer than ``timeout`` seconds.
        """
        psql = [str(self.bindir / "psql"), "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql, self.url(dbname)]
        env = {**os.environ, "PGCONNECT_TIMEOUT": str(max(1, round(PROBE_TIMEOUT_SECONDS)))}
        try:
            result = subprocess.run(psql, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise self._error(f"did not answer {sql!r} within {timeout} s") from exc
        if result.returncode != 0:
            raise self._error(f"failed {sql!r} ({result.returncode}): {result.stderr.strip()}")
        return result.stdout.strip()

    def stop(self, mode: PostgresStopMode = "fast", timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        """Shut the server down and wait until it has exited; a stopped server is left alone.

        ``mode`` is PostgreSQL's: "smart" waits for clients to leave, "fast" disconnects them, "immediate"
        quits without a checkpoint, as a crash would (the next start runs crash recovery). After
        ``timeout`` seconds the server is SIGKILLed.
        """
        if not self.running:
            return
        pid = self._postmaster_pid()
        if pid is None:
            self._kill()
        else:
            self._terminate(pid, _POSTGRES_STOP_SIGNALS[mode], timeout)

    def _stop_quickly(self) -> None:
        self.stop(mode="immediate")  # SIGKILL would leave its System V shared memory segment behind

    def _prepare(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        initdb = [str(self.bindir / "initdb"), "-D", str(self.data_dir), "-A", "trust", "-U", "postgres"]
        initdb += ["-E", "UTF8", "--no-sync", "--no-instructions"]
        result = subprocess.run(_as_postgres(initdb), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ServerError(f"initdb failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")

    def _command(self) -> list[str]:
        settings = {**self.settings, "port": str(self.port), "unix_socket_directories": str(self.base_dir)}
        options = [arg for name, value in settings.items() for arg in ("-c", f"{name}={value}")]
        return _as_postgres([str(self.bindir / "postgres"), "-D", str(self.data_dir), *options])

    def _accepts_connections(self) -> bool:
        async def connect_and_close() -> None:
            conn = await asyncpg.connect(self.url("postgres"), timeout=PROBE_TIMEOUT_SECONDS)
            await conn.close()

        return _listening(self.port) and _succeeds(connect_and_close)

    def _postmaster_pid(self) -> int | None:
        """The postmaster's pid from ``postmaster.pid`` (our child is ``runuser`` when we are root)."""
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            return int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
        return None


# --- RabbitMQ ---------------------------------------------------------------------------------------------

RABBITMQ_SERVER_CANDIDATES = ("/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/lib/rabbitmq/lib/*/sbin/rabbitmq-server")
EPMD_NAMES_REQ = 110  # "n": list the registered node names
QUORUM_TICK_MILLISECONDS = 100  # how often quorum queues publish the counts that ``queue_counts`` reads
# What docs/deploy.md recommends for a cluster (A frozen node): a node that stops answering (frozen, or its
# host gone) is declared down after 7.5 to 12.5 s (the tick time, give or take a quarter) instead of 45 to
# 75 s, and the partition it finds once it runs again ends with autoheal restarting it.
PARTITION_HANDLING = "autoheal"
NET_TICKTIME_SECONDS = 10
RABBITMQ_CONFIG = (
    f"[{{rabbit, [{{quorum_tick_interval, {QUORUM_TICK_MILLISECONDS}}},"
    f" {{cluster_partition_handling, {PARTITION_HANDLING}}}]}},\n"
    f" {{kernel, [{{net_ticktime, {NET_TICKTIME_SECONDS}}}]}},\n"
    " {ra, [{wal_sync_method, none}]}].\n"  # written, not fsynced: survives a crash of the node, not of the OS
)


def rabbitmq_server_script() -> Path:
    """RabbitMQ's own ``rabbitmq-server`` script (not Debian's /usr/sbin wrapper, which switches to the
    ``rabbitmq`` user and writes to /var/log). Raises ``ServerError`` when none is found.
    """
    for pattern in RABBITMQ_SERVER_CANDIDATES:
        found = sorted(glob.glob(pattern), reverse=True)
        if found:
            return Path(found[0])
    raise ServerError(f"no rabbitmq-server script found (looked for {RABBITMQ_SERVER_CANDIDATES})")


def epmd_names() -> set[str]:
    """Short names of the Erlang nodes registered with the local epmd; empty when epmd is not running."""
    try:
        sock = socket.create_connection((HOST, int(os.environ.get("ERL_EPMD_PORT", "4369"))), PROBE_TIMEOUT_SECONDS)
    except OSError:
        return set()
    with sock:
        sock.sendall(struct.pack(">HB", 1, EPMD_NAMES_REQ))
        reply = b"".join(iter(lambda: sock.recv(4096), b""))  # epmd closes the connection after answering
    lines = reply[4:].decode("utf-8", "replace").splitlines()  # after the 4-byte epmd port
    return {line.split()[1] for line in lines if line.startswith("name ")}


RabbitStopMode = Literal["graceful", "kill"]


class PrivateRabbitMQ(_ChildServer):
    """A throwaway single RabbitMQ node, without plugins (but management when asked), on
    ``127.0.0.1:<port>`` (user guest/guest).

    The node has a unique name registered with the machine's epmd, its own distribution port, and keeps its
    data in its folder across restarts, so durable queues and persistent messages survive ``restart``.
    The Erlang VM is our direct child (``RABBITMQ_ALLOW_INPUT`` makes the script ``exec`` it).
    """

    kind = "RabbitMQ"

    def __init__(self, *, cookie: str | None = None, management: bool = False) -> None:
        """``cookie``: the Erlang cookie, the same for every node of one cluster (by default the VM makes
        one of its own); ``management``: enable the management plugin on ``management_port``.
        """
        self.script = rabbitmq_server_script()  # before the temp folder exists: nothing to clean up if it fails
        super().__init__("chatexport-rmq-")
        self.port = free_port(HOST)
        self.dist_port = _free_port_other_than(self.port)
        self.management_port = _free_port_other_than(self.port, self.dist_port) if management else None
        self.short_name = f"chatexport-{uuid.uuid4().hex[:10]}"
        self.node_name = f"{self.short_name}@localhost"
        self._write_config(cookie)

    @property
    def url(self) -> str:
        """``amqp://guest:guest@127.0.0.1:<port>/``."""
        return f"amqp://guest:guest@{HOST}:{self.port}/"

    def stop(self, mode: RabbitStopMode = "graceful", timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        """Stop the node and wait until the VM has exited and epmd has forgotten its name.

        "graceful" sends SIGTERM (RabbitMQ shuts down in order, about 1 s), "kill" sends SIGKILL (a crash).
        After ``timeout`` seconds a graceful stop becomes a SIGKILL. Raises ``ServerError`` when the name
        is still registered with epmd ``timeout`` seconds later.
        """
        if self.running:
            assert self._process is not None
            sig = signal.SIGKILL if mode == "kill" else signal.SIGTERM
            self._terminate(self._process.pid, sig, timeout)
        self._wait_unregistered(_deadline(timeout))

    def queue_counts(self, queue: str, vhost: str = "/") -> dict[str, int]:
        """``{"messages_ready": n, "messages_unacknowledged": m}`` of ``queue``, from ``rabbitmqctl``.

        A quorum queue's counts may be up to ``QUORUM_TICK_MILLISECONDS`` old. Raises ``ServerError`` when
        the command fails, ``KeyError`` when there is no such queue.
        """
        rows = {row["name"]: row for row in self._list_queues(vhost)}
        row = rows[queue]
        return {
            "messages_ready": int(row["messages_ready"]),
            "messages_unacknowledged": int(row["messages_unacknowledged"]),
        }

    def _list_queues(self, vhost: str) -> list[dict[str, Any]]:
        columns = ("name", "messages_ready", "messages_unacknowledged")
        rows: list[dict[str, Any]] = self.ctl_json("list_queues", "--vhost", vhost, *columns)
        return rows

    def ctl(self, *args: str, tool: str = "rabbitmqctl", timeout: float = COMMAND_TIMEOUT_SECONDS) -> str:
        """Run RabbitMQ's ``tool`` (``rabbitmqctl``, ``rabbitmq-queues``, ...) with ``args`` against this
        node and return its output. Raises ``ServerError`` when it fails or takes over ``timeout`` seconds.
        """
        command = [str(self.script.parent / tool), "--node", self.node_name, "--quiet", *args]
        try:
            result = subprocess.run(
                command, env=self._environment(), capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise self._error(f"{tool} {args[0]} took over {timeout} s") from exc
        if result.returncode != 0:
            raise self._error(f"{tool} {args[0]} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def ctl_json(self, *args: str, tool: str = "rabbitmqctl", timeout: float = COMMAND_TIMEOUT_SECONDS) -> Any:
        """``ctl(*args, "--formatter", "json")`` parsed; same errors."""
        return json.loads(self.ctl(*args, "--formatter", "json", tool=tool, timeout=timeout))

    def _stop_quickly(self) -> None:
        self.stop(mode="kill")  # a graceful stop takes a second more

    def _wait_unregistered(self, deadline: float) -> None:
        while self.short_name in epmd_names():
            if time.monotonic() > deadline:
                raise self._error("stopped but its name is still registered with epmd")
            time.sleep(POLL_SECONDS)

    def _write_config(self, cookie: str | None) -> None:
        plugins = "[rabbitmq_management]" if self.management_port is not None else "[]"
        (self.base_dir / "enabled_plugins").write_text(f"{plugins}.\n")
        (self.base_dir / "rabbitmq-env.conf").write_text("")  # instead of /etc/rabbitmq/rabbitmq-env.conf
        # Erlang terms, not rabbitmq.conf: skips the cuttlefish translation at boot.
        (self.base_dir / "rabbitmq.config").write_text(self._config())
        for folder in ("mnesia", "log"):
            (self.base_dir / folder).mkdir()
        if cookie is not None:  # in HOME, where both the VM and rabbitmqctl look; Erlang wants it owner-only
            cookie_file = self.base_dir / ".erlang.cookie"
            cookie_file.write_text(cookie)
            cookie_file.chmod(0o400)

    def _config(self) -> str:
        if self.management_port is None:
            return RABBITMQ_CONFIG
        listener = f'{{rabbitmq_management, [{{listener, [{{port, {self.management_port}}}, {{ip, "{HOST}"}}]}}]}}'
        return RABBITMQ_CONFIG.removesuffix("].\n") + f",\n {listener}].\n"

    def _command(self) -> list[str]:
        return [str(self.script)]

    def _environment(self) -> dict[str, str]:
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        base = self.base_dir
        return {
            **inherited,
            "HOME": str(base),  # the Erlang cookie is created here, not in root's home
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_LOGS": "-",  # to stdout, which is our log file
            "RABBITMQ_NODENAME": self.node_name,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_ALLOW_INPUT": "true",  # the script execs the VM instead of running it under a shell
            "RABBITMQ_SERVER_START_ARGS": "-noinput",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_EPMD_ADDRESS": HOST,
        }

    def _accepts_connections(self) -> bool:
        async def connect_and_close() -> None:
            connection = await aio_pika.connect(self.url, timeout=PROBE_TIMEOUT_SECONDS)
            await connection.close()

        # A plain TCP probe first: aio_pika logs an error for every refused attempt.
        return _listening(self.port) and _succeeds(connect_and_close)


# --- TCP proxy --------------------------------------------------------------------------------------------

PROXY_CALL_TIMEOUT_SECONDS = 10.0
PROXY_CHUNK_BYTES = 65536
PROXY_MIN_CHUNK_BYTES = 1024
THROTTLE_STEP_SECONDS = 0.05  # a throttled proxy forwards about this many seconds' worth of bytes at a time


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close ``writer``'s connection with a TCP RST, so the peer sees "connection reset"."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _error_response(status: int) -> bytes:
    """A complete HTTP/1.1 answer with ``status`` and an S3 ``InternalError`` body, closing the connection."""
    body = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code></Error>"
    head = f"HTTP/1.1 {status} Injected\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"Connection: close\r\n\r\n" + body


@dataclass(eq=False)
class _Link:
    """One proxied connection: the client's side and, once connected, the target's side."""

    client: asyncio.StreamWriter
    task: asyncio.Task[Any] | None
    upstream: asyncio.StreamWriter | None = None
    next_send: float = 0.0  # loop time at which this connection may forward its next chunk (per connection)

    def drop(self) -> None:
        """Reset the client's connection and abort the target's."""
        _reset(self.client)
        if self.upstream is not None:
            self.upstream.transport.abort()

    def close(self) -> None:
        self.client.close()
        if self.upstream is not None:
            self.upstream.close()


class TcpProxy:
    """Forwards TCP connections from ``127.0.0.1:<port>`` to ``target_host:target_port``; listens from the
    moment it is created.

    It runs an event loop in its own thread, so it keeps forwarding whatever the test's loop is doing, and
    its methods are plain calls that block for milliseconds. A connection ends as soon as either side
    closes it (no half-close). Use ``with TcpProxy(host, port) as proxy:`` or call ``close()``.
    Raises ``OSError`` when ``port`` is taken.
    """

    def __init__(self, target_host: str, target_port: int, *, port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self._port = port
        self._blocked = False
        self._answer: bytes | None = None  # set by answer_with: what every new connection gets instead
        self._bytes_per_second: float | None = None
        self._per_connection = False
        self._flowing = asyncio.Event()  # cleared by freeze: every pipe holds its bytes until thaw
        self._flowing.set()
        self.next_send = 0.0  # loop time at which the throttled proxy may forward its next chunk
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"tcp-proxy-{target_port}", daemon=True)
        self._thread.start()
        try:
            self._call(self._listen())
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        """The port the proxy listens on; the same after ``block``/``unblock``."""
        return self._port

    @property
    def endpoint(self) -> tuple[str, int]:
        """``("127.0.0.1", port)``."""
        return HOST, self._port

    @property
    def open_connections(self) -> int:
        """How many client connections are being forwarded right now."""
        return len(self._links)

    @property
    def faults(self) -> list[str]:
        """What is switched on now (``blocked``, ``throttled``, ``frozen``, ``answering``): empty for a proxy
        that forwards everything as it comes.
        """
        on = {
            "blocked": self._blocked,
            "throttled": self._bytes_per_second is not None,
            "frozen": not self._flowing.is_set(),
            "answering": self._answer is not None,
        }
        return [name for name, switched in on.items() if switched]

    def block(self) -> None:
        """Reset every open connection and stop listening: new connections are refused until ``unblock``."""
        self._call(self._block())

    def unblock(self) -> None:
        """Listen and forward again on the same port. Raises ``OSError`` if someone took the port meanwhile."""
        self._call(self._listen())

    def throttle(self, bytes_per_second: float | None, *, per_connection: bool = False) -> None:
        """Forward at most ``bytes_per_second`` bytes per second, all connections and both directions
        together, or each connection (both directions) on its own when ``per_connection``, as a store that
        limits every connection does; ``None`` lifts the limit. Applies to connections already open too.
        """
        if bytes_per_second is not None and bytes_per_second <= 0:
            raise ValueError("bytes_per_second must be positive or None")
        self._call(self._set_rate(bytes_per_second, per_connection))

    def freeze(self) -> None:
        """Hold every byte in both directions, on open and new connections alike, without closing anything, as
        a peer that was frozen (SIGSTOP) does; ``thaw`` forwards what was held and goes on.
        """
        self._call(self._set_flowing(False))

    def thaw(self) -> None:
        """Forward again after ``freeze``."""
        self._call(self._set_flowing(True))

    async def _set_flowing(self, flowing: bool) -> None:
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    def answer_with(self, status: int | None) -> None:
        """Answer every request on a new connection with an HTTP ``status`` and an S3-style error body, then
        close it, as a failing server would; open connections are dropped so that clients reconnect.
        ``None`` forwards again.
        """
        self._call(self._set_answer(status))

    def close(self) -> None:
        """Drop every connection, stop listening and end the proxy's thread; safe to call twice."""
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            self._call(self._block())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(PROXY_CALL_TIMEOUT_SECONDS)
        self._loop.close()

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(PROXY_CALL_TIMEOUT_SECONDS)

    async def _set_rate(self, bytes_per_second: float | None, per_connection: bool) -> None:
        self._bytes_per_second = bytes_per_second
        self._per_connection = per_connection

    async def _set_answer(self, status: int | None) -> None:
        self._answer = None if status is None else _error_response(status)
        if status is not None:
            for link in list(self._links):
                link.drop()

    async def _listen(self) -> None:
        self._blocked = False
        if self._server is None:
            self._server = await asyncio.start_server(self._forward, HOST, self._port, reuse_address=True)
            self._port = self._server.sockets[0].getsockname()[1]

    async def _block(self) -> None:
        self._blocked = True
        if self._server is not None:
            self._server.close()  # closes the listening socket now: connects are refused
            self._server = None
        links = list(self._links)
        for link in links:
            link.drop()
        tasks = {link.task for link in links if link.task is not None}
        if tasks:  # return once every handler has finished, so no connection is half-dropped
            await asyncio.wait(tasks, timeout=PROXY_CALL_TIMEOUT_SECONDS / 2)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer, asyncio.current_task())
        self._links.add(link)
        try:
            if self._answer is not None:
                await self._answer_and_close(reader, writer, self._answer)
                return
            await self._connect_and_pipe(link, reader)
        finally:
            self._links.discard(link)
            link.close()

    @staticmethod
    async def _answer_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: bytes) -> None:
        """Read a request (its body too, unless the client waits for ``100 Continue``, which a final answer
        may skip), then send ``answer``; the connection is closed by the caller. Reading the body first
        makes the client see the answer rather than a reset.
        """
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), PROXY_CALL_TIMEOUT_SECONDS)).lower()
            length = re.search(rb"\r\ncontent-length: *(\d+)", head)
            if length and b"\r\nexpect: 100-continue" not in head:
                await asyncio.wait_for(reader.readexactly(int(length.group(1))), PROXY_CALL_TIMEOUT_SECONDS)
            writer.write(answer)
            await writer.drain()

    async def _connect_and_pipe(self, link: _Link, reader: asyncio.StreamReader) -> None:
        try:
            upstream_reader, link.upstream = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            link.drop()  # the target is down: the client sees a reset, as with no proxy in between
            return
        if self._blocked:
            link.drop()
            return
        pipes = [
            asyncio.create_task(self._pipe(reader, link.upstream, link)),
            asyncio.create_task(self._pipe(upstream_reader, link.client, link)),
        ]
        _, pending = await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link) -> None:
        """Copy ``reader`` to ``writer`` of ``link`` until end of stream or a connection error, paced by
        ``throttle``.
        """
        with contextlib.suppress(OSError):
            while data := await reader.read(self._chunk_bytes()):
                await self._flowing.wait()
                await self._pace(len(data), link)
                writer.write(data)
                await writer.drain()

    def _chunk_bytes(self) -> int:
        if self._bytes_per_second is None:
            return PROXY_CHUNK_BYTES
        step = int(self._bytes_per_second * THROTTLE_STEP_SECONDS)
        return max(PROXY_MIN_CHUNK_BYTES, min(PROXY_CHUNK_BYTES, step))

    async def _pace(self, size: int, link: _Link) -> None:
        """Wait for this chunk's turn: chunks are spaced so that the rate (the total's, or ``link``'s when
        throttled per connection) stays at the limit.
        """
        if self._bytes_per_second is None:
            return
        clock: TcpProxy | _Link = link if self._per_connection else self
        now = self._loop.time()
        send_at = max(now, clock.next_send)
        clock.next_send = send_at + size / self._bytes_per_second
        await asyncio.sleep(send_at - now)
