"""Injecting a round's faults and healing them (docs/development.md: Development, The fault harness).

``Injector.inject(fault)`` breaks something at once, waits the fault's duration and repairs what it broke;
faults overlap freely. ``Injector.heal()`` then makes sure that, whatever happened, every part runs, the
servers answer, S3 and the receiver are back, before the round's checks begin. Every action is written to
the round's event log with its time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import glob
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import asyncpg

from devtools.localsystem import READY_TIMEOUT_SECONDS
from devtools.prerequisites import FAKETIME_LIBRARY
from devtools.servers import PostgresStopMode, RabbitStopMode
from services.janitor.leadership import LEADER_LOCK_KEY
from shared.settings import amqp_node_urls
from tests.chaos.plan import PARTS, Fault, FaultKind
from tests.chaos.system import (
    JANITOR_INTERVAL_SECONDS,
    LEASE_SECONDS,
    REQUEUE_AFTER_SECONDS,
    ChaosClusters,
    ChaosSystem,
)

# Holds the relay's "mark published" inside its transaction, after the broker confirmed the publish, for
# less than the statement timeout; the harness kills the relay meanwhile. Other updates pass.
HOLD_MARKS_SQL = """
CREATE OR REPLACE FUNCTION chaos_hold_outbox_marks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.published_at IS NULL AND NEW.published_at IS NOT NULL THEN
        PERFORM pg_sleep(2);
    END IF;
    RETURN NEW;
END;
$$;
CREATE OR REPLACE TRIGGER chaos_hold_outbox_marks BEFORE UPDATE ON outbox
    FOR EACH ROW EXECUTE FUNCTION chaos_hold_outbox_marks();
"""
RELEASE_MARKS_SQL = "DROP TRIGGER IF EXISTS chaos_hold_outbox_marks ON outbox"
# The newest published wake-up made unpublished again, as if its relay had crashed before its commit: the
# relay publishes it again (a duplicate the workers must shrug off), and its mark is the one held.
REPUBLISH_SQL = """
UPDATE outbox SET published_at = NULL
WHERE outbox_id = (SELECT max(outbox_id) FROM outbox WHERE published_at IS NOT NULL)
RETURNING outbox_id
"""
HOLD_WAIT_SECONDS = 5.0
HELD_MARK_SQL = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query ILIKE 'UPDATE outbox%'"
# Long enough for the lease to expire and the janitor to hand the work to another worker meanwhile.
STOP_PAST_LEASE_SECONDS = LEASE_SECONDS + REQUEUE_AFTER_SECONDS + 2 * JANITOR_INTERVAL_SECONDS
TERM_TIMEOUT_SECONDS = 15.0
POLL_SECONDS = 0.05


def faketime_library() -> str:
    """The path of Debian's libfaketime (package ``faketime``). Raises ``RuntimeError`` when it is missing."""
    found = sorted(glob.glob(FAKETIME_LIBRARY))
    if not found:
        raise RuntimeError("libfaketime is missing: install Debian's faketime package")
    return found[0]


class Injector:
    """Breaks and repairs ``system``; ``log(text)`` records each action. ``injected`` counts the faults that
    took effect by kind; ``windows`` holds each fault's (start, end) in monotonic seconds.
    """

    def __init__(self, system: ChaosSystem, log: Callable[[str], None]) -> None:
        self.system = system
        self.log = log
        self.injected: dict[str, int] = {}
        self.windows: list[tuple[float, float]] = []
        self.healed_at = time.monotonic()
        self._restarting: dict[str, asyncio.Lock] = {name: asyncio.Lock() for name in PARTS}
        self._servers = asyncio.Lock()

    async def inject(self, fault: Fault) -> None:
        """Inject ``fault``, wait ``fault.for_seconds`` and repair it. A fault that found nothing to act on
        (a part already down, no wake-up to hold) is logged and not counted, so that overlapping faults
        stay independent.
        """
        started = time.monotonic()
        self.log(f"inject {fault.kind} target={fault.target} detail={fault.detail} for={fault.for_seconds}")
        took_effect = await _ACTIONS[fault.kind](self, fault)
        self.windows.append((started, time.monotonic()))
        if took_effect:
            self.injected[fault.kind] = self.injected.get(fault.kind, 0) + 1
        self.log(f"repaired {fault.kind} target={fault.target}{'' if took_effect else ' (it found nothing to act on)'}")

    async def heal(self) -> None:
        """Every part running and ready, both servers up (in cluster mode every node and server, replay
        resumed, a former primary rebuilt as a standby), S3 and the receiver answering normally, no held
        outbox mark. Raises ``RuntimeError`` (``ServerError`` for a cluster) when that cannot be reached.
        """
        proxy = self.system.faulty.proxy
        proxy.answer_with(None)
        proxy.throttle(None)
        proxy.unblock()
        await self.system.receiver.up()
        async with self._servers:
            if self.system.clusters is not None:
                await asyncio.to_thread(self.system.clusters.repair)
            for server in (self.system.postgres, self.system.rabbitmq):
                if server is not None and not server.running:
                    await asyncio.to_thread(server.start)
        await self._release_marks()
        for name in PARTS:
            self._signal(name, signal.SIGCONT)
            await self._ensure_running(name)
        await asyncio.to_thread(self.system.faulty.system.wait_ready, None, READY_TIMEOUT_SECONDS)
        self.healed_at = time.monotonic()

    # --- the faults -------------------------------------------------------------------------------------

    async def _kill(self, fault: Fault) -> bool:
        running = self._running(fault.target)
        if running:
            await asyncio.to_thread(self.system.faulty.system.group.kill, fault.target)
        await asyncio.sleep(fault.for_seconds)  # the fault: the part stays down this long
        await self._ensure_running(fault.target)
        return running

    async def _term(self, fault: Fault) -> bool:
        running = self._running(fault.target)
        if running:
            self._signal(fault.target, signal.SIGCONT)  # a stopped part could not drain
            await asyncio.to_thread(
                self.system.faulty.system.group.stop, fault.target, signal.SIGTERM, TERM_TIMEOUT_SECONDS
            )
        await asyncio.sleep(fault.for_seconds)
        await self._ensure_running(fault.target)
        return running

    async def _stop(self, fault: Fault) -> bool:
        running = self._running(fault.target)
        self._signal(fault.target, signal.SIGSTOP)
        await asyncio.sleep(STOP_PAST_LEASE_SECONDS)  # the fault: frozen past its lease
        self._signal(fault.target, signal.SIGCONT)
        return running

    async def _restart_broker(self, fault: Fault) -> bool:
        mode: RabbitStopMode = "kill" if fault.detail == "kill" else "graceful"
        rabbitmq = self.system.rabbitmq
        assert rabbitmq is not None, "the single broker's fault, never planned in cluster mode"
        return await self._restart(functools.partial(rabbitmq.stop, mode), rabbitmq.start, fault.for_seconds)

    async def _restart_database(self, fault: Fault) -> bool:
        mode: PostgresStopMode = "immediate" if fault.detail == "immediate" else "fast"
        postgres = self.system.postgres
        assert postgres is not None, "the single database's fault, never planned in cluster mode"
        return await self._restart(functools.partial(postgres.stop, mode), postgres.start, fault.for_seconds)

    async def _restart(self, stop: Callable[[], None], start: Callable[[], None], seconds: float) -> bool:
        """Stop a server, keep it down ``seconds``, start it again; one server restart at a time."""
        async with self._servers:
            await asyncio.to_thread(stop)
            await asyncio.sleep(seconds)  # the fault: the server stays down this long
            await asyncio.to_thread(start)
        return True

    async def _kill_broker_node(self, fault: Fault) -> bool:
        node = self._clusters().rabbit.nodes[int(fault.detail) - 1]
        async with self._servers:
            if not node.running:
                return False
            await asyncio.to_thread(node.stop, "kill")
            await asyncio.sleep(fault.for_seconds)  # the fault: the node stays down this long
            await asyncio.to_thread(node.start)
        return True

    async def _database_failover(self, fault: Fault) -> bool:
        clusters = self._clusters()
        async with self._servers:
            old = await asyncio.to_thread(clusters.fail_over)
            self.log(f"promoted the server on port {clusters.postgres.primary.port}")
            await asyncio.sleep(fault.for_seconds)  # the fault: the old primary stays down this long
            await asyncio.to_thread(clusters.postgres.rebuild_standby, old)
            self.log(f"rebuilt the server on port {old.port} as a standby")
        return True

    async def _replay_paused(self, fault: Fault) -> bool:
        clusters = self._clusters()
        async with self._servers:
            standby = clusters.standby_to_pause()
            await asyncio.to_thread(clusters.postgres.pause_replay, standby)
            self.log(f"paused replay on the server on port {standby.port}")
            await asyncio.sleep(fault.for_seconds)  # the fault: the standby shows no newer commit this long
            await asyncio.to_thread(clusters.postgres.resume_replay, standby)
        return True

    async def _s3_cut(self, fault: Fault) -> bool:
        self.system.faulty.proxy.block()
        await asyncio.sleep(fault.for_seconds)
        self.system.faulty.proxy.unblock()
        return True

    async def _s3_slow(self, fault: Fault) -> bool:
        self.system.faulty.proxy.throttle(float(fault.detail))
        await asyncio.sleep(fault.for_seconds)
        self.system.faulty.proxy.throttle(None)
        return True

    async def _s3_errors(self, fault: Fault) -> bool:
        self.system.faulty.proxy.answer_with(500)
        await asyncio.sleep(fault.for_seconds)
        self.system.faulty.proxy.answer_with(None)
        return True

    async def _janitor_lock_lost(self, fault: Fault) -> bool:
        ended = await self._database(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks"
            " WHERE locktype = 'advisory' AND classid = 0 AND objid = $1 AND objsubid = 1 AND granted",
            LEADER_LOCK_KEY,
        )
        self.log(f"terminated {ended} leader lock session(s)")
        return bool(ended)

    async def _clock_shift(self, fault: Fault) -> bool:
        shifted = {
            "LD_PRELOAD": faketime_library(),
            "FAKETIME": f"{int(fault.detail):+d}",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # only the wall clock moves
        }
        async with self._restarting[fault.target]:
            await self._replace(fault.target, shifted)
        # Work for at least a lease with the shifted clock: long enough to claim, heartbeat and finish.
        await asyncio.sleep(max(fault.for_seconds, LEASE_SECONDS))
        async with self._restarting[fault.target]:
            await self._replace(fault.target, {})
        return True

    async def _bad_wakeup(self, fault: Fault) -> bool:
        settings = self.system.faulty.settings
        for url in amqp_node_urls(settings.amqp_url):
            try:
                connection = await aio_pika.connect(url, timeout=2)
                async with connection:
                    channel = await connection.channel()
                    body = aio_pika.Message(b"\xff\xfe not a wake-up", delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
                    await channel.default_exchange.publish(body, routing_key=settings.amqp_queue)
            except (aio_pika.exceptions.AMQPError, OSError, TimeoutError):
                continue  # this node is down: try the next
            return True
        return False  # the broker is down: there is nothing to inject

    async def _relay_killed_before_commit(self, fault: Fault) -> bool:
        if await self._database(HOLD_MARKS_SQL, execute=True) is None:
            return False
        killed = False
        try:
            if await self._database(REPUBLISH_SQL) is not None:
                deadline = time.monotonic() + HOLD_WAIT_SECONDS
                while time.monotonic() < deadline and not await self._database(HELD_MARK_SQL):
                    await asyncio.sleep(POLL_SECONDS)  # polling Postgres for the held statement
                if await self._database(HELD_MARK_SQL) and self._running("relay"):
                    await asyncio.to_thread(self.system.faulty.system.group.kill, "relay")
                    killed = True
        finally:
            await self._release_marks()
        await asyncio.sleep(fault.for_seconds)
        await self._ensure_running("relay")
        return killed

    async def _receiver_down(self, fault: Fault) -> bool:
        await self.system.receiver.down()
        await asyncio.sleep(fault.for_seconds)
        await self.system.receiver.up()
        return True

    async def _receiver_mode(self, fault: Fault) -> bool:
        self.system.receiver.mode = "slow" if fault.kind is FaultKind.RECEIVER_SLOW else "errors"
        await asyncio.sleep(fault.for_seconds)
        self.system.receiver.mode = "up"
        return True

    # --- helpers ----------------------------------------------------------------------------------------

    def _clusters(self) -> ChaosClusters:
        """Cluster mode's servers; the cluster faults are planned only in cluster mode."""
        assert self.system.clusters is not None, "a cluster fault outside cluster mode"
        return self.system.clusters

    def _running(self, name: str) -> bool:
        return name in self.system.faulty.system.group.pids()

    def _signal(self, name: str, sig: int) -> None:
        if self._running(name):
            with contextlib.suppress(ProcessLookupError):
                self.system.faulty.system.group.send(name, sig)

    async def _ensure_running(self, name: str) -> None:
        async with self._restarting[name]:
            if not self._running(name):
                self.system.faulty.system.start_part(_service(name), name=name)
                self.log(f"started {name}")

    async def _replace(self, name: str, extra_env: dict[str, str]) -> None:
        """Stop ``name`` (SIGTERM, it drains) and start it again with ``extra_env``; wait until it is ready
        (a database or broker down meanwhile may delay that: then it gets ready later).
        """
        if self._running(name):
            self._signal(name, signal.SIGCONT)
            await asyncio.to_thread(self.system.faulty.system.group.stop, name, signal.SIGTERM, TERM_TIMEOUT_SECONDS)
        self.system.faulty.system.start_part(_service(name), name=name, extra_env=extra_env)
        self.log(f"started {name} with {sorted(extra_env) or 'its own clock'}")
        with contextlib.suppress(RuntimeError):
            await asyncio.to_thread(self.system.faulty.system.wait_ready, [name], READY_TIMEOUT_SECONDS)

    async def _release_marks(self) -> None:
        """Drop the trigger that holds the relay's marks, retrying while the database is away. Raises
        ``RuntimeError`` when it cannot within ``READY_TIMEOUT_SECONDS``.
        """
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while await self._database(RELEASE_MARKS_SQL, execute=True) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("could not drop the trigger that holds the relay's marks")
            await asyncio.sleep(POLL_SECONDS)  # the database is restarting

    async def _database(self, sql: str, *args: Any, execute: bool = False) -> Any:
        """``fetchval`` one statement (``execute`` for a script) on a connection of its own; None when the
        database cannot be reached.
        """
        try:
            connection = await asyncpg.connect(self.system.database_url, timeout=2)
        except (TimeoutError, OSError, asyncpg.PostgresError):
            return None
        try:
            return await (connection.execute(sql) if execute else connection.fetchval(sql, *args))
        except (OSError, asyncpg.PostgresError):
            return None
        finally:
            await connection.close()


def _service(name: str) -> str:
    """The compose service of a process name: ``worker-2`` -> ``worker``."""
    return name.rsplit("-", 1)[0] if name.startswith("worker-") else name


_ACTIONS: dict[FaultKind, Callable[[Injector, Fault], Awaitable[bool]]] = {
    FaultKind.KILL: Injector._kill,
    FaultKind.TERM: Injector._term,
    FaultKind.STOP: Injector._stop,
    FaultKind.RESTART_BROKER: Injector._restart_broker,
    FaultKind.RESTART_DATABASE: Injector._restart_database,
    FaultKind.S3_CUT: Injector._s3_cut,
    FaultKind.S3_SLOW: Injector._s3_slow,
    FaultKind.S3_ERRORS: Injector._s3_errors,
    FaultKind.JANITOR_LOCK_LOST: Injector._janitor_lock_lost,
    FaultKind.CLOCK_SHIFT: Injector._clock_shift,
    FaultKind.BAD_WAKEUP: Injector._bad_wakeup,
    FaultKind.RELAY_KILLED_BEFORE_COMMIT: Injector._relay_killed_before_commit,
    FaultKind.RECEIVER_DOWN: Injector._receiver_down,
    FaultKind.RECEIVER_SLOW: Injector._receiver_mode,
    FaultKind.RECEIVER_ERRORS: Injector._receiver_mode,
    FaultKind.KILL_BROKER_NODE: Injector._kill_broker_node,
    FaultKind.DATABASE_FAILOVER: Injector._database_failover,
    FaultKind.REPLAY_PAUSED: Injector._replay_paused,
}
