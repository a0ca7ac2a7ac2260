"""Local clusters for development and tests, built from the private servers of ``devtools.servers``: a
RabbitMQ cluster of private nodes and a PostgreSQL primary with streaming hot standbys.

As with the servers, the methods block (async code calls them through ``asyncio.to_thread``), every timeout
is in seconds, and failures raise ``ServerError``. Single nodes and servers are stopped, killed and
restarted through their own ``stop`` and ``start``.

``python -m devtools.clusters`` (``make clusters``) starts a three-node RabbitMQ cluster and a primary with
one standby, prints the settings that point the parts at them, and destroys both on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from devtools.servers import HOST, POLL_SECONDS, PrivatePostgres, PrivateRabbitMQ, ServerError
from shared.migrator import migrate

CLUSTER_START_TIMEOUT_SECONDS = 180.0  # three RabbitMQ nodes take about 20 s on two idle cores
PROMOTE_TIMEOUT_SECONDS = 60.0
# What a hot standby needs from its primary; the same on every server, so that any of them can be promoted
# and a standby's limits are never below its primary's (PostgreSQL refuses to start it otherwise).
REPLICATION_SETTINGS = {"wal_level": "replica", "max_wal_senders": "10", "hot_standby": "on"}


def _in_parallel(calls: Iterable[Callable[[], object]]) -> None:
    """Run every call at once in threads and wait for all; re-raises the first failure once all ended."""
    calls = list(calls)
    with concurrent.futures.ThreadPoolExecutor(max(1, len(calls)), thread_name_prefix="cluster") as pool:
        futures = [pool.submit(call) for call in calls]
    for future in futures:
        future.result()


def _wait_until(condition: Callable[[], bool], timeout: float, failure: str) -> None:
    """Poll ``condition`` until it is true; a ``ServerError`` it raises counts as "not yet". Raises
    ``ServerError(failure)`` after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(ServerError):
            if condition():
                return
        if time.monotonic() > deadline:
            raise ServerError(f"{failure} within {timeout} s")
        time.sleep(POLL_SECONDS)


def _destroy_all(destroyers: Iterable[Callable[[], None]]) -> None:
    """Call every destroyer, even when one fails; re-raises a failure afterwards."""
    with contextlib.ExitStack() as stack:
        for destroy in destroyers:
            stack.callback(destroy)


def _log_path(folder: Path | None, name: str) -> Path | None:
    return None if folder is None else folder / f"{name}.log"


# --- RabbitMQ ---------------------------------------------------------------------------------------------


class RabbitCluster:
    """Three (``size``) private RabbitMQ nodes joined into one cluster.

    The nodes share an Erlang cookie and are named ``<unique>@localhost``; the first ``start`` joins nodes
    2..n to node 1 before anything declares a queue, so quorum queues declared afterwards get a member on
    every node (one declared earlier keeps one member: rabbitmq-server #3850).
    """

    def __init__(self, size: int = 3, *, management: bool = False) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        cookie = secrets.token_hex(20).upper()
        self.nodes: list[PrivateRabbitMQ] = []
        try:
            for _ in range(size):
                self.nodes.append(PrivateRabbitMQ(cookie=cookie, management=management))
        except BaseException:
            self.destroy()
            raise
        self._formed = False

    @property
    def urls(self) -> list[str]:
        """One ``amqp://`` URL per node, node 1 first."""
        return [node.url for node in self.nodes]

    @property
    def amqp_url(self) -> str:
        """Every node's URL joined with ``,``: the value of ``CHATEXPORT_AMQP_URL``."""
        return ",".join(self.urls)

    def start(self, timeout: float = CLUSTER_START_TIMEOUT_SECONDS) -> None:
        """Start every node at once and wait until ``cluster_status`` shows them all running.

        The first time, nodes 2..n then join node 1 (``stop_app``, ``join_cluster``, ``start_app``). Later
        starts (after ``stop``) must start the nodes together: a 3.10 node that was stopped with its peers
        waits for them before it opens its listener. Raises ``ServerError`` after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        _in_parallel(functools.partial(node.start, timeout) for node in self.nodes)
        if not self._formed:
            for node in self.nodes[1:]:
                self._join(node)
            self._formed = True
        names = {node.node_name for node in self.nodes}
        remaining = max(0.0, deadline - time.monotonic())
        _wait_until(lambda: self.running_nodes() == names, remaining, "not every node of the cluster ran")
        # A node counts as running before it has finished booting; a quorum queue declared meanwhile may
        # leave it out of its members.
        _in_parallel(functools.partial(node.ctl, "await_startup") for node in self.nodes)

    def stop(self) -> None:
        """Stop every node gracefully, all at once."""
        _in_parallel(node.stop for node in self.nodes)

    def destroy(self, keep_logs_in: Path | None = None) -> None:
        """Kill and delete every node; with ``keep_logs_in`` (an existing folder) keep each node's log there
        as ``rabbitmq-<i>.log`` (from 1). Safe to call twice.
        """
        _destroy_all(
            functools.partial(node.destroy, keep_log_as=_log_path(keep_logs_in, f"rabbitmq-{index}"))
            for index, node in enumerate(self.nodes, 1)
        )

    def running_nodes(self) -> set[str]:
        """The names of the nodes whose RabbitMQ application runs, as a running node's ``cluster_status``
        sees them. Raises ``ServerError`` when no node answers.
        """
        status = self._ask("cluster_status")
        return set(status["running_nodes"])

    def leader_of(self, queue: str, vhost: str = "/") -> PrivateRabbitMQ:
        """The node that leads the quorum queue ``queue`` right now. Raises ``KeyError`` when there is no such
        queue, ``ServerError`` when no node answers or the queue has no leader.
        """
        leader = self._queue_row(queue, vhost)["leader"]
        for node in self.nodes:
            if node.node_name == leader:
                return node
        raise ServerError(f"queue {queue!r} is led by {leader!r}, not a node of this cluster")

    def members_of(self, queue: str, vhost: str = "/") -> list[str]:
        """The node names of the quorum queue ``queue``'s members, sorted; errors as ``leader_of``."""
        return sorted(self._queue_row(queue, vhost)["members"])

    def management_url(self) -> str:
        """``http://guest:guest@127.0.0.1:<port>/``, node 1's management API. Raises ``ValueError`` when the
        cluster was made without ``management``.
        """
        port = self.nodes[0].management_port
        if port is None:
            raise ValueError("this cluster was made without management=True")
        return f"http://guest:guest@{HOST}:{port}/"

    def _join(self, node: PrivateRabbitMQ) -> None:
        node.ctl("stop_app")
        node.ctl("join_cluster", self.nodes[0].node_name)
        node.ctl("start_app")

    def _queue_row(self, queue: str, vhost: str) -> dict[str, Any]:
        rows = self._ask("list_queues", "--vhost", vhost, "name", "leader", "members")
        row: dict[str, Any] = {row["name"]: row for row in rows}[queue]
        return row

    def _ask(self, *args: str) -> Any:
        """``ctl_json(*args)`` on the first running node that answers."""
        error = ServerError("no node of the cluster is running")
        for node in self.nodes:
            if node.running:
                try:
                    return node.ctl_json(*args)
                except ServerError as exc:
                    error = exc
        raise error


# --- PostgreSQL -------------------------------------------------------------------------------------------


class PostgresCluster:
    """A private primary with ``standbys`` streaming hot standbys; with ``synchronous``, a commit waits for
    any one standby (``synchronous_standby_names = 'ANY 1 (...)'``).

    ``primary`` is the server that takes writes (after ``promote``, the promoted one), ``standbys`` the
    servers that replay from it, ``former_primaries`` the ones promotions replaced (left as they were).
    Each server's ``application_name`` is ``postgres<i>`` (from 1, the first primary).
    """

    def __init__(self, standbys: int = 1, *, synchronous: bool = False) -> None:
        if standbys < 0:
            raise ValueError("standbys must be 0 or more")
        self.synchronous = synchronous
        servers: list[PrivatePostgres] = []
        try:
            for _ in range(standbys + 1):
                servers.append(PrivatePostgres(settings=REPLICATION_SETTINGS))
        except BaseException:
            _destroy_all(server.destroy for server in servers)
            raise
        self.primary = servers[0]
        self.standbys = servers[1:]
        self.former_primaries: list[PrivatePostgres] = []
        self._names = {server: f"postgres{index}" for index, server in enumerate(servers, 1)}

    @property
    def servers(self) -> list[PrivatePostgres]:
        """Every server: the primary, its standbys, then the former primaries, most recent first."""
        return [self.primary, *self.standbys, *self.former_primaries]

    def start(self, timeout: float = CLUSTER_START_TIMEOUT_SECONDS) -> None:
        """Start the primary (``initdb`` the first time: its default ``pg_hba.conf`` lets 127.0.0.1 replicate
        with trust), make each new standby with ``pg_basebackup -R``, start the standbys together and wait
        until every one streams (and, with ``synchronous``, counts for synchronous commit).

        Raises ``ServerError`` after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        self.primary.start(timeout)
        for standby in self.standbys:
            if not (standby.data_dir / "PG_VERSION").exists():
                standby.base_backup_of(self.primary, application_name=self._names[standby], timeout=timeout)
        _in_parallel(functools.partial(standby.start, timeout) for standby in self.standbys)
        self._follow(self.primary, self.standbys, max(0.0, deadline - time.monotonic()))

    def database_url(self, dbname: str) -> str:
        """``postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/<dbname>?target_session_attrs=read-write``: every
        server, the primary first, so a client finds whichever one takes writes.
        """
        hosts = ",".join(f"{HOST}:{server.port}" for server in self.servers)
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"

    def server_url(self, server: PrivatePostgres, dbname: str) -> str:
        """The URL of database ``dbname`` on ``server`` alone (a standby's, for reads)."""
        return server.url(dbname)

    async def create_database(self, dbname: str) -> str:
        """Create the empty database ``dbname`` on the primary and return its ``database_url``."""
        await self.primary.create_database(dbname)
        return self.database_url(dbname)

    def promote(self, standby: PrivatePostgres, timeout: float = PROMOTE_TIMEOUT_SECONDS) -> None:
        """Promote ``standby`` (``pg_promote``) and wait until it takes writes; it becomes ``primary``. The
        other running standbys are pointed at it; it requires a synchronous standby only when
        ``synchronous`` and another standby follows it (a promoted server that waits for a standby it does
        not have hangs every commit).

        The former primary is neither stopped nor fenced. Raises ``ValueError`` when ``standby`` is not one
        of ``standbys``, ``ServerError`` when the promotion or the re-pointing fails within ``timeout``
        seconds.
        """
        if standby not in self.standbys:
            raise ValueError("only a standby of this cluster can be promoted")
        deadline = time.monotonic() + timeout
        if standby.query(f"SELECT pg_promote(true, {max(1, int(timeout))})", timeout=timeout) != "t":
            raise ServerError(f"{self._names[standby]} was not promoted within {timeout} s")
        self.standbys.remove(standby)
        self.former_primaries.insert(0, self.primary)
        self.primary = standby
        followers = [server for server in self.standbys if server.running]
        for follower in followers:
            conninfo = f"host={HOST} port={standby.port} user=postgres application_name={self._names[follower]}"
            follower.query(f"ALTER SYSTEM SET primary_conninfo = '{conninfo}'")
            follower.query("SELECT pg_reload_conf()")
        self._follow(standby, followers, max(0.0, deadline - time.monotonic()))

    def rebuild_standby(self, former: PrivatePostgres, timeout: float = CLUSTER_START_TIMEOUT_SECONDS) -> None:
        """Make the stopped former primary ``former`` a standby of ``primary`` again, on its own port: its data
        folder is replaced by a fresh ``pg_basebackup -R`` (rather than ``pg_rewind``: these databases are
        small), it starts, and ``primary`` counts it (with ``synchronous``) for synchronous commit again.

        Raises ``ValueError`` when ``former`` is not one of ``former_primaries`` or still runs, ``ServerError``
        when the backup, the start or the streaming fails within ``timeout`` seconds.
        """
        if former not in self.former_primaries or former.running:
            raise ValueError("only a stopped former primary of this cluster can be rebuilt as a standby")
        deadline = time.monotonic() + timeout
        shutil.rmtree(former.data_dir)
        former.base_backup_of(self.primary, application_name=self._names[former], timeout=timeout)
        former.start(max(0.0, deadline - time.monotonic()))
        self.former_primaries.remove(former)
        self.standbys.append(former)
        followers = [server for server in self.standbys if server.running]
        self._follow(self.primary, followers, max(0.0, deadline - time.monotonic()))

    def pause_replay(self, standby: PrivatePostgres, timeout: float = PROMOTE_TIMEOUT_SECONDS) -> None:
        """Pause WAL replay on ``standby`` (``pg_wal_replay_pause``) and wait until it has paused: it keeps
        receiving WAL but shows no newer commit until ``resume_replay``. Raises ``ServerError`` otherwise.
        """
        standby.query("SELECT pg_wal_replay_pause()")
        _wait_until(
            lambda: standby.query("SELECT pg_get_wal_replay_pause_state()") == "paused",
            timeout,
            f"replay on {self._names[standby]} did not pause",
        )

    def resume_replay(self, standby: PrivatePostgres) -> None:
        """Resume WAL replay on ``standby`` (``pg_wal_replay_resume``). Raises ``ServerError`` when it fails."""
        standby.query("SELECT pg_wal_replay_resume()")

    def destroy(self, keep_logs_in: Path | None = None) -> None:
        """Stop and delete every server; with ``keep_logs_in`` (an existing folder) keep each server's log
        there as ``postgres<i>.log``. Safe to call twice.
        """
        _destroy_all(
            functools.partial(server.destroy, keep_log_as=_log_path(keep_logs_in, self._names[server]))
            for server in self.servers
        )

    def _follow(self, primary: PrivatePostgres, standbys: list[PrivatePostgres], timeout: float) -> None:
        """Wait until each of ``standbys`` streams from ``primary``, then set ``primary``'s
        ``synchronous_standby_names`` (empty unless ``synchronous`` and it has standbys) and wait until they
        count for it.
        """
        names = sorted(self._names[standby] for standby in standbys)
        wanted = "streaming|quorum" if self.synchronous and names else "streaming|async"
        synchronous_names = f"ANY 1 ({', '.join(names)})" if self.synchronous and names else ""
        primary.query(f"ALTER SYSTEM SET synchronous_standby_names = '{synchronous_names}'")
        primary.query("SELECT pg_reload_conf()")

        def all_streaming() -> bool:
            rows = primary.query("SELECT application_name, state, sync_state FROM pg_stat_replication").splitlines()
            return sorted(row.split("|", 1)[0] for row in rows if row.endswith(wanted)) == names

        _wait_until(all_streaming, timeout, f"standbys {names} did not stream from {self._names[primary]}")


# --- python -m devtools.clusters --------------------------------------------------------------------------

DATABASE_NAME = "chatexport"


def main() -> None:
    """Start a three-node RabbitMQ cluster (with the management API) and a PostgreSQL primary with one
    standby (holding a migrated ``chatexport`` database), print the settings to use and how to reach each
    node, and destroy both on SIGINT or SIGTERM.
    """
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    rabbit, postgres = RabbitCluster(management=True), PostgresCluster()
    try:
        _in_parallel([rabbit.start, postgres.start])
        database_url = asyncio.run(postgres.create_database(DATABASE_NAME))
        asyncio.run(migrate(postgres.server_url(postgres.primary, DATABASE_NAME)))
        print(_banner(rabbit, postgres, database_url), flush=True)
        stopping.wait()
    finally:
        _destroy_all([rabbit.destroy, postgres.destroy])


def _banner(rabbit: RabbitCluster, postgres: PostgresCluster, database_url: str) -> str:
    """What ``main`` prints: the settings as ``export`` lines, then each server and how to reach it."""
    standby_url = postgres.server_url(postgres.standbys[0], DATABASE_NAME)
    lines = [
        "# Both clusters are up; the chatexport database is created and migrated. In another shell:",
        f"export CHATEXPORT_AMQP_URL={rabbit.amqp_url}",
        f"export CHATEXPORT_AMQP_MANAGEMENT_URL={rabbit.management_url()}",
        "export CHATEXPORT_AMQP_QUORUM_INITIAL_GROUP_SIZE=3",
        f"export CHATEXPORT_DATABASE_URL={database_url}",
        f"export CHATEXPORT_DATABASE_READ_URL={standby_url}",
        "make run    # every part on the clusters",
        "",
        "# RabbitMQ nodes (kill one with: kill -KILL <pid>); rabbitmqctl for a node: HOME=<folder> <ctl> --node <name>",
    ]
    for node in rabbit.nodes:
        lines.append(f"#   {node.node_name} port {node.port} pid {node.pid} folder {node.base_dir}")
    lines.append(f"#   ctl: {rabbit.nodes[0].script.parent / 'rabbitmqctl'}")
    lines.append("# PostgreSQL servers:")
    for server in postgres.servers:
        role = "primary" if server is postgres.primary else "standby"
        lines.append(f"#   {role} {postgres.server_url(server, DATABASE_NAME)} data {server.data_dir}")
    lines.append("# Ctrl-C stops and deletes both clusters.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
