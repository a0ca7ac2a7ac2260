"""A bounded memo of what a process built recently: the renderings of operations, the request an operation
stores, the tokens it verified. One mechanism for each of them: the least recently used entry leaves first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


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
