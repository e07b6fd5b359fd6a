"""A memory of the newest entries of a stream a process does not control (Events seen, writes made, refusals
told), bounded: past its capacity the entry written longest ago is forgotten first. A process that runs for
days keeps what matters now, never all it ever saw; what it forgets costs at most a write said again."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Recent(Generic[K, V]):
    """Entries by key, the newest written kept. Not safe across threads: kube/recent.py SharedRecent is."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self._capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        return self._entries.get(key)

    def put(self, key: K, value: V) -> None:
        """`key` is the newest entry now, with `value`; the oldest go past the capacity."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def add(self, key: K, value: V) -> bool:
        """Puts `key` unless it is there: whether it was not (a check and its write in one step)."""
        if key in self._entries:
            return False
        self.put(key, value)
        return True

    def pop(self, key: K) -> V | None:
        return self._entries.pop(key, None)

    def take_all(self) -> list[V]:
        """Every value, oldest first, and the memory emptied."""
        values = list(self._entries.values())
        self._entries.clear()
        return values

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
