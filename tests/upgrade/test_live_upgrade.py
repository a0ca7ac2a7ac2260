"""The previous release rolled onto this one while it runs, and back (docs/deploy.md: Upgrading, The live upgrade
test): both on one PostgreSQL database, one RabbitMQ and one bucket, with traffic through every step.

Forward: the previous release runs under traffic; this release's pre migrations are applied under it; this
release's parts start beside it, and both releases' apis and workers serve until exports, and chunks of one
export, have been claimed by workers of both; the previous release's parts stop; the post migrations run;
this release alone goes on. Back: the same until both run, then this release's parts stop while they hold
work, and the previous release alone finishes everything on the migrated schema.

Either way every export ends once, with a file that verifies, every callback is sent for one event, the
schedule's runs keep their chain, and no object is left that the janitor does not know.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devtools.releases import Release
from shared.version import VERSION
from tests.support import wait_for
from tests.support.upgrade import OWNER, Upgrade, upgrade_under_way

pytestmark = pytest.mark.upgrade

BOTH_TIMEOUT_SECONDS = 90.0
# Exports submitted through the release left alone before the traffic stops.
ALONE_SUBMITS = 6


@contextlib.asynccontextmanager
async def traffic(upgrade: Upgrade) -> AsyncIterator[asyncio.Task[None]]:
    """The traffic and the chunk sampler in the background for the block; yields the traffic's task (see
    ``going``); an error of either is raised at the block's end.
    """
    stop = asyncio.Event()
    tasks = [asyncio.create_task(upgrade.traffic(stop)), asyncio.create_task(upgrade.sample_chunk_holders(stop))]
    try:
        yield tasks[0]
    finally:
        stop.set()
        done = await asyncio.gather(*tasks, return_exceptions=True)
    for outcome in done:
        if isinstance(outcome, BaseException):
            raise outcome


def going(task: asyncio.Task[None]) -> None:
    """Raise what ended the traffic's ``task`` early, so that a wait on it fails at once."""
    if task.done():
        task.result()
        raise AssertionError("the traffic stopped")


async def both_releases_side_by_side(
    upgrade: Upgrade, previous: Release, load: asyncio.Task[None], **overrides: str
) -> None:
    """Migrate ``--pre`` under the previous release, start this release's parts beside it (with ``overrides``,
    setting name -> value) and send traffic through both until workers of both have claimed exports and chunks
    of one export.
    """
    upgrade.new.env.update(overrides)
    await wait_for(lambda: upgrade.submitted, timeout=30)  # exports in flight
    with upgrade.timed("migrate --pre under the previous release"):
        await asyncio.to_thread(upgrade.new.run_cli, "migrate", "--pre")
    with upgrade.timed("this release's parts started"):
        await asyncio.to_thread(upgrade.new.start_parts, workers=2, janitors=1, one_shots=False)
    upgrade.note_workers(VERSION, upgrade.new)
    upgrade.open_api("new", upgrade.new)
    await upgrade.both_started()

    async def both_serve() -> bool:
        going(load)
        await upgrade.check_nothing_dead_lettered()
        upgrade.check_no_error_logged()
        claimed = await upgrade.releases_that_claimed()
        return claimed == {previous.version, VERSION} and len(upgrade.releases_holding_chunks_of_one_export()) == 2

    with upgrade.timed("both releases side by side"):
        await wait_for(both_serve, timeout=BOTH_TIMEOUT_SECONDS, interval=0.5)


async def submits_through_one_api(upgrade: Upgrade, load: asyncio.Task[None]) -> None:
    """Let ``ALONE_SUBMITS`` more exports go through the one api left, and the schedule fire once at least since
    both releases started (on a fast machine the steps before can take less than its interval).
    """
    target = len(upgrade.submitted) + ALONE_SUBMITS

    async def submitted() -> bool:
        going(load)
        await upgrade.check_nothing_dead_lettered()
        upgrade.check_no_error_logged()
        return len(upgrade.submitted) >= target and await upgrade.fired_since_both_started()

    await wait_for(submitted, timeout=120, interval=0.2)


async def end_the_schedule(upgrade: Upgrade, via: str) -> None:
    response = await upgrade.apis[via].post(
        f"/v3/export-schedules/{upgrade.schedule_id}/pause", headers=upgrade.auth(OWNER)
    )
    assert response.status == 200, await response.text()


async def check_everything(upgrade: Upgrade, via: str) -> None:
    await end_the_schedule(upgrade, via)
    await upgrade.check_every_export_ended_once(via)
    await upgrade.check_the_schedule(via)
    await upgrade.check_no_unknown_object()


async def test_the_previous_release_is_rolled_onto_this_one_under_traffic(previous: Release, tmp_path: Path) -> None:
    async with upgrade_under_way(previous, tmp_path) as upgrade:
        async with traffic(upgrade) as load:
            await both_releases_side_by_side(upgrade, previous, load)
            await upgrade.retire_api("old")
            with upgrade.timed("the previous release's parts stopped"):
                codes = await asyncio.to_thread(upgrade.old.stop)
            assert all(code in (0, -15) for code in codes.values()), codes
            assert upgrade.unexpected_exits() == {}
            with upgrade.timed("migrate --post"):
                await asyncio.to_thread(upgrade.new.run_cli, "migrate", "--post")
            await submits_through_one_api(upgrade, load)
        with upgrade.timed("every export ended and checked"):
            await check_everything(upgrade, "new")
        assert upgrade.unexpected_exits() == {}
        print(f"live upgrade {previous.version} -> {VERSION}: {upgrade.timings}, {await upgrade.summary()}")


async def test_the_previous_release_alone_finishes_everything_after_a_rollback(
    previous: Release, tmp_path: Path
) -> None:
    async with upgrade_under_way(previous, tmp_path) as upgrade:
        async with traffic(upgrade) as load:
            # No grace: what this release's workers hold when they stop is handed back at once.
            await both_releases_side_by_side(upgrade, previous, load, CHATEXPORT_SHUTDOWN_GRACE_SECONDS="0")
            await upgrade.retire_api("new")
            # Stopped mid-way, while coordinating a chunked export.
            await wait_for(lambda: upgrade.coordinating(VERSION), timeout=60, interval=0.05)
            with upgrade.timed("this release's parts stopped"):
                codes = await asyncio.to_thread(upgrade.new.stop)
            assert all(code in (0, -15) for code in codes.values()), codes
            await submits_through_one_api(upgrade, load)
        with upgrade.timed("every export ended and checked"):
            await check_everything(upgrade, "old")
        # What this release's workers held when they stopped, the previous release's finished.
        assert await upgrade.finished_by(previous.version, handed_back_by=VERSION) > 0
        print(f"rollback {VERSION} -> {previous.version}: {upgrade.timings}, {await upgrade.summary()}")
