"""Waiting for dependencies and draining in-flight work."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import subprocess
import sys
import types

import pytest

from chatexport.cli import PARTS
from shared.lifecycle import Stopped, drain, keep_trying, started


async def test_keep_trying_retries_the_listed_errors_until_success() -> None:
    attempts: list[int] = []

    async def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionRefusedError
        return "open"

    result = await keep_trying(flaky, what="thing", errors=(OSError,), stop=asyncio.Event(), first_delay_seconds=0.01)
    assert result == "open"
    assert len(attempts) == 3


async def test_keep_trying_gives_up_on_stop_and_does_not_retry_other_errors() -> None:
    stop = asyncio.Event()

    async def down() -> None:
        stop.set()
        raise ConnectionRefusedError

    with pytest.raises(Stopped):
        await keep_trying(down, what="thing", errors=(OSError,), stop=stop, first_delay_seconds=10)

    async def broken() -> None:
        raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError, match="a bug"):
        await keep_trying(broken, what="thing", errors=(OSError,), stop=asyncio.Event())


async def test_drain_waits_for_work_that_starts_meanwhile_and_cancels_what_overruns() -> None:
    tasks: set[asyncio.Task[None]] = set()
    finished: list[str] = []

    async def work(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)  # the work being drained, not synchronisation
        finished.append(name)
        if name == "first":
            late = asyncio.create_task(work("late", 0.01))
            tasks.add(late)
            late.add_done_callback(tasks.discard)

    for name, seconds in (("first", 0.01), ("slow", 60)):
        task = asyncio.create_task(work(name, seconds))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    await asyncio.wait_for(drain(tasks, grace_seconds=0.5), 5)
    assert finished == ["first", "late"]
    assert not tasks


# A child that frees a large block (which, by default, raises glibc's threshold), then fills another, allocates
# a small object after it, frees the large one and prints how much of it stayed resident, in bytes.
_RESIDENT_AFTER_FREE = """
import os, sys
from shared.lifecycle import map_large_allocations
if sys.argv[1] == "mapped":
    map_large_allocations()
size = 8 * 1024 * 1024
page = os.sysconf("SC_PAGE_SIZE")
def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * page
first = bytearray(size)
del first
before = resident()
block = bytearray(b"x") * size
pinned = [bytes(100) for _ in range(1000)]
del block
print(resident() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc on Linux")
def test_large_allocations_go_back_to_the_system_once_mapped_on_their_own() -> None:
    def kept(mode: str) -> int:
        child = subprocess.run(
            [sys.executable, "-c", _RESIDENT_AFTER_FREE, mode], capture_output=True, text=True, check=True
        )
        return int(child.stdout)

    # What the default leaves resident shows that the check can see the difference.
    assert kept("default") > 4 * 1024 * 1024
    assert kept("mapped") < 1024 * 1024


# A child that runs a part under ``run_until_signalled`` (or, with "inside", calls its ``serve`` directly, as a
# test does): start-up leaves a cycle of garbage and keeps a list, then marks itself started. It prints the
# collector's frozen count, whether the garbage is gone and whether the kept list is frozen.
_STARTED = """
import asyncio, gc, sys, weakref
from shared.lifecycle import run_until_signalled, started

class Node:
    pass

async def serve(settings, *, stop):
    garbage = Node()
    garbage.itself = garbage
    gone = weakref.ref(garbage)
    del garbage
    kept = [Node()]
    started()
    print(gc.get_freeze_count(), gone() is None, any(item is kept for item in gc.get_objects()))

if sys.argv[1] == "part":
    asyncio.run(run_until_signalled(serve, None))
else:
    asyncio.run(serve(None, stop=asyncio.Event()))
"""


@pytest.mark.parametrize("run_as", ["part", "inside"])
def test_started_freezes_what_a_part_built_only_in_its_own_process(run_as: str) -> None:
    child = subprocess.run([sys.executable, "-c", _STARTED, run_as], capture_output=True, text=True, check=True)
    frozen, garbage_gone, kept_walked = child.stdout.split()
    if run_as == "part":
        # Every import's objects are out of the collector's passes, the start-up's garbage was collected first.
        assert int(frozen) > 10_000
        assert (garbage_gone, kept_walked) == ("True", "False")
    else:
        assert (frozen, kept_walked) == ("0", "True")


def _names_used(code: types.CodeType) -> set[str]:
    """The global and attribute names ``code`` and the functions defined in it use (not its comments)."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names_used(constant)
    return names


@pytest.mark.parametrize("module", sorted({part.module for part in PARTS.values()}))
def test_every_part_marks_the_end_of_its_start_up(module: str) -> None:
    # Each part's serve calls ``started`` once its resources are built (docs/benchmark.md: The collector's full
    # passes); a new part that forgets it is named here.
    loaded = importlib.import_module(module)
    assert loaded.started is started
    own = [value for value in vars(loaded).values() if inspect.isfunction(value) and value.__module__ == module]
    assert any("started" in _names_used(function.__code__) for function in own)
