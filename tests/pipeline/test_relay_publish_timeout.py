"""A publish the broker does not confirm within ``CHATEXPORT_PUBLISH_TIMEOUT_SECONDS`` holds its outbox row
back and renews the relay's channel, as a nack does (docs/deploy.md: A frozen node): the relay's connection to
the real RabbitMQ runs through a proxy that holds every byte for a while, as a frozen node would.
"""

from __future__ import annotations

import asyncio

import asyncpg
from yarl import URL

from devtools.servers import TcpProxy
from services.relay.relay import Relay
from shared import broker
from shared.repository import outbox
from shared.settings import Settings
from tests.support import wait_for

PUBLISH_TIMEOUT_SECONDS = 1.0


async def unpublished(pool: asyncpg.Pool) -> int:
    count: int = await pool.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL")
    return count


async def test_a_publish_that_is_not_confirmed_in_time_renews_the_channel(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    target = URL(settings.amqp_url)
    assert target.host is not None and target.port is not None
    with TcpProxy(target.host, target.port) as proxy:
        proxied = settings.model_copy(
            update={
                "amqp_url": str(target.with_port(proxy.port)),
                "publish_timeout_seconds": PUBLISH_TIMEOUT_SECONDS,
            }
        )
        session = await broker.open_session_when_ready(
            proxied, name="relay under test", stop=asyncio.Event(), on_return_raises=True
        )
        try:
            relay = Relay(pool=pool, channel=session.channel, exchange=session.exchange, settings=proxied)
            first = await session.channel.get_underlay_channel()
            async with pool.acquire() as conn:
                await outbox.enqueue_run(conn, operation_id="op_1")
            proxy.freeze()  # as a frozen node: the publish and its confirm never pass
            assert (await relay.publish_due()).handled == 1
            assert await unpublished(pool) == 1  # held back, to be published again
            proxy.thaw()

            async def renewed() -> bool:
                return not session.channel.is_closed and await session.channel.get_underlay_channel() is not first

            await wait_for(renewed, timeout=30)
            await pool.execute("UPDATE outbox SET not_before = now()")
            assert (await relay.publish_due()).handled == 1
            assert await unpublished(pool) == 0
        finally:
            await session.connection.close()
