"""A bounded memo of what a process built recently: the renderings of operations, the request an operation
stores, the tokens it verified. One mechanism for each of them: the least recently used entry leaves first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
S = TypeVar("S")


class RecentlyUsed(Generic[K, V]):
    """At most ``capacity`` entries (``capacity`` >= 1); reading an entry or writing one makes it the most
    recently used, and a write past ``capacity`` drops the least recently used. Not thread-safe: one event
    loop's code uses each.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self._capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The entry under ``key``, now the most recently used; None when there is none."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` under ``key`` as the most recently used entry and return it."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        if len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
        return value

    def forget(self, key: K) -> None:
        """Drop the entry under ``key``, if any."""
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)


def kept_for(memo: RecentlyUsed[K, tuple[S, V]], key: K, stamp: S) -> V | None:
    """The value ``memo`` keeps under ``key`` for ``stamp``, now the most recently used; None when it keeps none,
    or one for another stamp.

    The stamp tells apart what one key names at two times or places (an operation's creation time: the tests run
    operations of one id in many databases in one process). It is compared, not hashed with the key: hashing an
    aware datetime costs more than the rest of the lookup (docs/benchmark.md: The poll's own work).
    """
    kept = memo.get(key)
    return None if kept is None or kept[0] != stamp else kept[1]


def built_for(memo: RecentlyUsed[K, tuple[S, V]], key: K, stamp: S, build: Callable[[], V]) -> V:
    """``kept_for``, else ``build()``, kept under ``key`` for ``stamp`` from now on."""
    value = kept_for(memo, key, stamp)
    if value is None:
        value = memo.put(key, (stamp, build()))[1]
    return value
