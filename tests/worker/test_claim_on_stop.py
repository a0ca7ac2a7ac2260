"""A stop that lands while a claim commits or its message is acked still hands the lease back (docs/kubernetes.md:
Stopping and scaling down): otherwise the lease just taken would be held by a stopped worker until it expires,
and the export or chunk would wait for it.

The claim and the message are stand-ins: what is tested is the order of claim, ack and hand-back around a cancel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import asyncpg
import pytest
from aio_pika.abc import AbstractIncomingMessage

from services.worker.queue.consumer import NotClaimed, claim_or_requeue

T = TypeVar("T")


class Message:
    """Records how it was settled; ``ack`` waits for ``release`` when given one."""

    def __init__(self, release: asyncio.Event | None = None) -> None:
        self.settled: list[str] = []
        self.acking = asyncio.Event()
        self._release = release

    async def ack(self) -> None:
        self.acking.set()
        if self._release is not None:
            await self._release.wait()
        self.settled.append("ack")

    async def nack(self, requeue: bool) -> None:
        self.settled.append(f"nack requeue={requeue}")


def _message(message: Message) -> AbstractIncomingMessage:
    return cast(AbstractIncomingMessage, message)


def _claiming(
    message: Message, claim: Callable[[], Awaitable[T | None]], hand_back: Callable[[T], Awaitable[None]]
) -> asyncio.Task[T | None]:
    """``claim_or_requeue`` of ``message`` in a task of its own, for the test to cancel."""

    async def claiming() -> T | None:
        return await claim_or_requeue(_message(message), claim, hand_back=hand_back, log_extra={})

    return asyncio.create_task(claiming())


async def test_a_stop_during_the_claim_hands_back_what_it_took() -> None:
    claiming, committed = asyncio.Event(), asyncio.Event()
    handed_back: list[str] = []

    async def claim() -> str:
        claiming.set()
        await committed.wait()  # the commit is on its way when the stop comes
        return "lease-1"

    async def hand_back(claimed: str) -> None:
        handed_back.append(claimed)

    message = Message()
    task = _claiming(message, claim, hand_back)
    await asyncio.wait_for(claiming.wait(), 5)
    task.cancel()
    committed.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert handed_back == ["lease-1"]
    assert message.settled == ["ack"]


async def test_a_stop_during_the_ack_hands_back_what_the_claim_took() -> None:
    handed_back: list[str] = []

    async def claim() -> str:
        return "lease-2"

    async def hand_back(claimed: str) -> None:
        handed_back.append(claimed)

    acked = asyncio.Event()
    message = Message(release=acked)
    task = _claiming(message, claim, hand_back)
    await asyncio.wait_for(message.acking.wait(), 5)
    task.cancel()
    acked.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert (message.settled, handed_back) == (["ack"], ["lease-2"])


async def test_a_stop_after_a_claim_that_took_nothing_hands_nothing_back() -> None:
    claiming, answered = asyncio.Event(), asyncio.Event()
    handed_back: list[Any] = []

    async def claim() -> None:
        claiming.set()
        await answered.wait()

    async def hand_back(claimed: Any) -> None:
        handed_back.append(claimed)

    task = _claiming(Message(), claim, hand_back)
    await asyncio.wait_for(claiming.wait(), 5)
    task.cancel()
    answered.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert handed_back == []


async def test_a_claim_without_a_database_requeues_and_hands_nothing_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("services.worker.queue.consumer.DATABASE_RETRY_SECONDS", 0.0)
    handed_back: list[Any] = []

    async def claim() -> str:
        raise asyncpg.CannotConnectNowError("starting up")

    async def hand_back(claimed: Any) -> None:
        handed_back.append(claimed)

    message = Message()
    with pytest.raises(NotClaimed):
        await claim_or_requeue(_message(message), claim, hand_back=hand_back, log_extra={})
    assert (message.settled, handed_back) == (["nack requeue=True"], [])


async def test_a_second_cancel_during_the_hand_back_does_not_cut_it_short() -> None:
    claiming, committed, handing, release = asyncio.Event(), asyncio.Event(), asyncio.Event(), asyncio.Event()
    handed_back: list[str] = []

    async def claim() -> str:
        claiming.set()
        await committed.wait()
        return "lease-3"

    async def hand_back(claimed: str) -> None:
        handing.set()
        await release.wait()
        handed_back.append(claimed)

    task = _claiming(Message(), claim, hand_back)
    await asyncio.wait_for(claiming.wait(), 5)
    task.cancel()
    committed.set()
    await asyncio.wait_for(handing.wait(), 5)
    task.cancel()  # a second stop, while the lease is being handed back
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert handed_back == ["lease-3"]


async def test_a_claim_that_fails_as_the_worker_stops_leaves_the_stop_going_on() -> None:
    claiming, answered = asyncio.Event(), asyncio.Event()

    async def claim() -> str:
        claiming.set()
        await answered.wait()
        raise asyncpg.UndefinedFunctionError("claim_export does not exist")

    async def hand_back(claimed: str) -> None:
        raise AssertionError("nothing was claimed")

    task = _claiming(Message(), claim, hand_back)
    await asyncio.wait_for(claiming.wait(), 5)
    task.cancel()
    answered.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
