"""The system the fault harness breaks: a private PostgreSQL cluster and RabbitMQ node (so that either may be
restarted), the compose file's parts as local processes with two workers and one janitor, S3 (moto)
behind a proxy that can cut it, slow it or make it answer 500, and a callback receiver.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from devtools.servers import PrivatePostgres, PrivateRabbitMQ
from shared.auth import mint_token
from shared.db import migrate
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
}
LEASE_SECONDS = 3.0
# The janitor hands an expired lease's operation back this long after expiry (FAST's setting), on its
# next pass (FAST: every 0.5 s).
REQUEUE_AFTER_SECONDS = 2.0
JANITOR_INTERVAL_SECONDS = 0.5
# A backend whose client died notices within this long even inside a statement, and rolls back.
CONNECTION_CHECK_INTERVAL = "100ms"


@dataclass
class ChaosSystem:
    """Handles on everything a round drives, breaks and inspects."""

    faulty: Faulty
    postgres: PrivatePostgres
    rabbitmq: PrivateRabbitMQ
    receiver: Receiver
    database_url: str
    log_dir: Path

    def auth(self, user_id: str, *, admin: bool = False) -> dict[str, str]:
        """Bearer headers for ``user_id`` signed with the system's secret."""
        token = mint_token(self.faulty.settings, user_id=user_id, scopes=["admin"] if admin else None)
        return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def chaos_system(log_dir: Path) -> AsyncIterator[ChaosSystem]:
    """Start the servers, the parts and the receiver; stop and delete them all on exit."""
    postgres, rabbitmq = PrivatePostgres(), PrivateRabbitMQ()
    receiver = Receiver()
    try:
        await asyncio.gather(asyncio.to_thread(postgres.start), asyncio.to_thread(rabbitmq.start))
        database_url = await postgres.create_database("chatexport")
        await migrate(database_url)
        await _check_connections(postgres, database_url)
        await receiver.start()
        async with running(
            log_dir, database_url=database_url, amqp_url=rabbitmq.url, overrides=CHAOS_SETTINGS
        ) as faulty:
            yield ChaosSystem(faulty, postgres, rabbitmq, receiver, database_url, log_dir)
    finally:
        await receiver.close()
        postgres.destroy(keep_log_as=log_dir / "postgres.log")
        rabbitmq.destroy(keep_log_as=log_dir / "rabbitmq.log")


async def _check_connections(postgres: PrivatePostgres, database_url: str) -> None:
    """Make the database's backends notice a dead client within ``CONNECTION_CHECK_INTERVAL``: a relay killed
    while its statement is held must not leave that statement running.
    """
    database = database_url.rsplit("/", 1)[1]
    connection = await asyncpg.connect(postgres.url())
    try:
        await connection.execute(
            f"ALTER DATABASE \"{database}\" SET client_connection_check_interval = '{CONNECTION_CHECK_INTERVAL}'"
        )
    finally:
        await connection.close()
