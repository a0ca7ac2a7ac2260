"""The relay killed between the broker's confirm and marking the row published (docs/states.md: States and failure
model): the row is published again, and the duplicate wake-up changes nothing.
"""

from __future__ import annotations

from pathlib import Path

import aio_pika
import asyncpg
import pytest

from tests.support import AMQP_URL, cloned_database, wait_for
from tests.support.fault_harness import Faulty, check_ended_correctly, make_conversation, running

pytestmark = pytest.mark.e2e

# Holds every UPDATE of an outbox row, i.e. the relay's "mark published", inside its transaction: the
# relay has published and been confirmed, and hangs before its commit.
HOLD_MARKS_SQL = """
CREATE FUNCTION hold_outbox_marks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(300);
    RETURN NEW;
END;
$$;
CREATE TRIGGER hold_outbox_marks BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION hold_outbox_marks();
"""
RELEASE_MARKS_SQL = "DROP TRIGGER hold_outbox_marks ON outbox; DROP FUNCTION hold_outbox_marks();"


async def unpublished_rows(faulty: Faulty, operation_id: str) -> int:
    count: int = await faulty.pool.fetchval(
        "SELECT count(*) FROM outbox WHERE operation_id = $1 AND published_at IS NULL", operation_id
    )
    return count


async def queue_is_empty(faulty: Faulty) -> bool:
    connection = await aio_pika.connect(faulty.settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(faulty.settings.amqp_queue, passive=True)
        return queue.declaration_result.message_count == 0


async def test_a_relay_killed_after_the_confirm_publishes_again_and_the_duplicate_changes_nothing(
    template_db: str, tmp_path: Path
) -> None:
    async with cloned_database(template_db, "chatexport_f") as database_url:
        admin = await asyncpg.connect(database_url)
        try:
            # A backend whose client died notices within 100 ms even in pg_sleep, and rolls back.
            database = database_url.rsplit("/", 1)[1]
            await admin.execute(f"ALTER DATABASE \"{database}\" SET client_connection_check_interval = '100ms'")
            # The relay's held UPDATE must outlast the test rather than hit the statement timeout.
            patient = {"CHATEXPORT_DATABASE_TIMEOUT_SECONDS": "300"}
            async with running(tmp_path, database_url=database_url, amqp_url=AMQP_URL, overrides=patient) as f:
                await make_conversation(f, "c-a", ["alice"], messages=30, body_bytes=20)
                fingerprint = await f.messages_fingerprint()
                expected = await f.expected("alice", "c-a")
                await admin.execute(HOLD_MARKS_SQL)

                operation_id = await f.submit("alice", "c-a", "dup-1")
                # The broker confirmed and a worker ran the export, yet the row is still unpublished.
                await f.wait_state(operation_id, "SUCCEEDED")
                assert await unpublished_rows(f, operation_id) == 1
                f.system.group.kill("relay")
                await admin.execute(RELEASE_MARKS_SQL)

                f.system.start_part("relay", name="relay-2")
                await wait_for(lambda: _published(f, operation_id), timeout=30)
                await wait_for(lambda: queue_is_empty(f), timeout=30)

                await check_ended_correctly(f, "alice", {operation_id: expected}, fingerprint=fingerprint)
                row = await f.operation(operation_id)
                assert (row["generation"], row["attempt"]) == (1, 1)
                outbox = await f.pool.fetchval("SELECT count(*) FROM outbox WHERE operation_id = $1", operation_id)
                assert outbox == 1
        finally:
            await admin.close()


async def _published(faulty: Faulty, operation_id: str) -> bool:
    return await unpublished_rows(faulty, operation_id) == 0
