"""The system the fault harness breaks: a private PostgreSQL cluster and RabbitMQ node (so that either may be
restarted), or in cluster mode a three-node RabbitMQ cluster and a PostgreSQL primary with two synchronous
standbys, the worker reading on one of them; the compose file's parts as local processes with two workers
and one janitor, S3 (moto) behind a proxy that can cut it, slow it or make it answer 500, and a callback
receiver.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from devtools.clusters import PostgresCluster, RabbitCluster
from devtools.servers import PrivatePostgres, PrivateRabbitMQ, ServerError
from shared.auth import mint_token
from shared.migrator import migrate
from tests.chaos.receiver import Receiver
from tests.support.fault_harness import Faulty, running

# Short leases, passes and backoffs, so that a round's takeovers, retries and clean-ups take seconds
# (docs/development.md: Development, The fault harness). The rest is FAST, the fault tests' settings.
CHAOS_SETTINGS: dict[str, str] = {
    "CHATEXPORT_ENVIRONMENT": "development",
    "CHATEXPORT_WEBHOOK_ALLOW_PRIVATE": "true",
    "CHATEXPORT_WEBHOOK_FIRST_RETRY_SECONDS": "0.5",
    "CHATEXPORT_WEBHOOK_TIMEOUT_SECONDS": "1",
    "CHATEXPORT_LEASE_SECONDS": "3",
    "CHATEXPORT_HEARTBEAT_SECONDS": "0.75",
    "CHATEXPORT_MAX_ATTEMPTS": "8",
    # The run-wide conversation (about 14 MB) is written in chunks of about 1 MiB; a round's own are not.
    "CHATEXPORT_CHUNK_THRESHOLD_BYTES": str(2 * 1024 * 1024),
    "CHATEXPORT_CHUNK_TARGET_BYTES": str(1024 * 1024),
    "CHATEXPORT_CHUNKS_PER_EXPORT": "3",
    # Schedules every second or two (the test-only minimum), fired within a fifth of a second.
    "CHATEXPORT_SCHEDULE_MIN_INTERVAL_SECONDS": "1",
    "CHATEXPORT_SCHEDULER_INTERVAL_SECONDS": "0.2",
}
LEASE_SECONDS = 3.0
# The janitor hands an expired lease's operation back this long after expiry (FAST's setting), on its
# next pass (FAST: every 0.5 s).
REQUEUE_AFTER_SECONDS = 2.0
JANITOR_INTERVAL_SECONDS = 0.5
# A backend whose client died notices within this long even inside a statement, and rolls back.
CONNECTION_CHECK_INTERVAL = "100ms"
# Cluster mode: a worker gives a paused or lagging standby 1 s (a paused replay lasts 1 to 5 s), and the
# work queue keeps a replica on each of the three nodes.
CLUSTER_SETTINGS: dict[str, str] = {
    "CHATEXPORT_DATABASE_READ_WAIT_SECONDS": "1",
    "CHATEXPORT_AMQP_QUORUM_INITIAL_GROUP_SIZE": "3",
}
# Two standbys in an ANY 1 set: a promotion leaves the new primary a synchronous standby to wait for.
STANDBYS = 2
DATABASE_NAME = "chatexport"


@dataclass
class ChaosClusters:
    """Cluster mode's servers; ``reader`` is the server ``CHATEXPORT_DATABASE_READ_URL`` names (a standby
    unless a failover promoted it). The parts are given every server's port once, and a failover rebuilds
    the old primary on its own port, so the database URL they were given stays right.
    """

    rabbit: RabbitCluster
    postgres: PostgresCluster
    reader: PrivatePostgres
    owns_rabbit: bool = True  # False: a cluster the caller started and deletes (its nodes are left running)

    def fail_over(self) -> PrivatePostgres:
        """Kill the primary (``immediate``: no checkpoint, clients cut off) and promote the standby that has
        received the most WAL, as a failover manager would (the other then follows it without a timeline
        fork); return the old primary, stopped. Raises ``ServerError`` when the promotion fails.
        """
        old = self.postgres.primary
        old.stop("immediate")
        running = [standby for standby in self.postgres.standbys if standby.running]
        received = {standby: _received_lsn(standby) for standby in running}
        self.postgres.promote(max(running, key=lambda standby: received[standby]))
        return old

    def standby_to_pause(self) -> PrivatePostgres:
        """The standby the worker reads on, or another one while a failover has made the reader primary."""
        return self.reader if self.reader in self.postgres.standbys else self.postgres.standbys[0]

    def repair(self) -> None:
        """Every broker node running (the stopped ones started together), every former primary rebuilt as a
        standby, every standby running and replaying. Raises ``ServerError`` when that fails.
        """
        if not all(node.running for node in self.rabbit.nodes):
            self.rabbit.start()  # starts the stopped nodes together, leaves the running ones alone
        if not self.postgres.primary.running:
            self.postgres.primary.start()
        for former in list(self.postgres.former_primaries):
            former.stop("immediate")
            self.postgres.rebuild_standby(former)
        for standby in self.postgres.standbys:
            standby.start()
            self.postgres.resume_replay(standby)

    def queue_counts(self, queue: str) -> dict[str, int]:
        """``queue``'s counts as the first running node reports them. Raises ``ServerError`` when none does."""
        running = [node for node in self.rabbit.nodes if node.running]
        if not running:
            raise ServerError("no broker node is running")
        return running[0].queue_counts(queue)

    def destroy(self, log_dir: Path) -> None:
        """Delete both clusters (the RabbitMQ one only when it ``owns_rabbit``), keeping their servers' logs in
        ``log_dir``.
        """
        try:
            if self.owns_rabbit:
                self.rabbit.destroy(keep_logs_in=log_dir)
        finally:
            self.postgres.destroy(keep_logs_in=log_dir)


@dataclass
class ChaosSystem:
    """Handles on everything a round drives, breaks and inspects."""

    faulty: Faulty
    postgres: PrivatePostgres | None  # the single servers; None in cluster mode
    rabbitmq: PrivateRabbitMQ | None
    receiver: Receiver
    database_url: str
    log_dir: Path
    clusters: ChaosClusters | None = None  # cluster mode's servers

    def queue_counts(self, queue: str) -> dict[str, int]:
        """``{"messages_ready": n, "messages_unacknowledged": m}`` of ``queue``, from a running node. Raises
        ``ServerError`` when no node answers, ``KeyError`` when there is no such queue.
        """
        if self.clusters is not None:
            return self.clusters.queue_counts(queue)
        assert self.rabbitmq is not None
        return self.rabbitmq.queue_counts(queue)

    def auth(self, user_id: str, *, admin: bool = False) -> dict[str, str]:
        """Bearer headers for ``user_id`` signed with the system's secret."""
        token = mint_token(self.faulty.settings, user_id=user_id, scopes=["admin"] if admin else None)
        return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def chaos_system(
    log_dir: Path, *, cluster: bool = False, rabbit: RabbitCluster | None = None
) -> AsyncIterator[ChaosSystem]:
    """Start the servers (with ``cluster``, the clusters), the parts and the receiver; stop and delete them
    all on exit. In cluster mode a started ``rabbit`` cluster is used instead of a new one (its nodes are
    left running, each stopped one started again).
    """
    if cluster:
        async with _clustered(log_dir, rabbit) as system:
            yield system
        return
    postgres, rabbitmq = PrivatePostgres(), PrivateRabbitMQ()
    receiver = Receiver()
    try:
        await asyncio.gather(asyncio.to_thread(postgres.start), asyncio.to_thread(rabbitmq.start))
        database_url = await _prepared(await postgres.create_database(DATABASE_NAME))
        await receiver.start()
        async with running(
            log_dir, database_url=database_url, amqp_url=rabbitmq.url, overrides=CHAOS_SETTINGS
        ) as faulty:
            yield ChaosSystem(faulty, postgres, rabbitmq, receiver, database_url, log_dir)
    finally:
        await receiver.close()
        postgres.destroy(keep_log_as=log_dir / "postgres.log")
        rabbitmq.destroy(keep_log_as=log_dir / "rabbitmq.log")


@contextlib.asynccontextmanager
async def _clustered(log_dir: Path, shared_rabbit: RabbitCluster | None) -> AsyncIterator[ChaosSystem]:
    """The system on a RabbitMQ cluster (``shared_rabbit``, or one of its own) and a synchronous primary with
    ``STANDBYS`` standbys, the worker reading on the first standby.
    """
    rabbit, postgres = shared_rabbit or RabbitCluster(), PostgresCluster(STANDBYS, synchronous=True)
    clusters = ChaosClusters(rabbit, postgres, reader=postgres.standbys[0], owns_rabbit=shared_rabbit is None)
    receiver = Receiver()
    try:
        # start() of a running cluster starts only its stopped nodes.
        await asyncio.gather(asyncio.to_thread(rabbit.start), asyncio.to_thread(postgres.start))
        database_url = await _prepared(await postgres.create_database(DATABASE_NAME))
        await receiver.start()
        read_url = postgres.server_url(clusters.reader, DATABASE_NAME)
        overrides = {**CHAOS_SETTINGS, **CLUSTER_SETTINGS, "CHATEXPORT_DATABASE_READ_URL": read_url}
        async with running(log_dir, database_url=database_url, amqp_url=rabbit.amqp_url, overrides=overrides) as faulty:
            yield ChaosSystem(faulty, None, None, receiver, database_url, log_dir, clusters)
    finally:
        await receiver.close()
        clusters.destroy(log_dir)


def _received_lsn(standby: PrivatePostgres) -> int:
    """How far (bytes of WAL) ``standby`` has received; -1 when it cannot say."""
    try:
        return int(standby.query("SELECT pg_last_wal_receive_lsn() - '0/0'::pg_lsn") or -1)
    except ServerError:
        return -1


async def _prepared(database_url: str) -> str:
    """``database_url``, migrated and with its connection checks set (``_check_connections``)."""
    await migrate(database_url)
    await _check_connections(database_url)
    return database_url


async def _check_connections(database_url: str) -> None:
    """Make the database's backends notice a dead client within ``CONNECTION_CHECK_INTERVAL``: a relay killed
    while its statement is held must not leave that statement running.
    """
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            f"ALTER DATABASE \"{DATABASE_NAME}\" SET client_connection_check_interval = '{CONNECTION_CHECK_INTERVAL}'"
        )
    finally:
        await connection.close()
