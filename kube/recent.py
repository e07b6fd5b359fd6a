"""models/recent.py's bounded memory for the processes' threads: a syncer's informers write what its workers
read (copies made, Events seen, writes whose watch events are not in yet)."""

from __future__ import annotations

import threading

from models.recent import K, Recent, V


class SharedRecent(Recent[K, V]):
    """Recent, each call one step under its lock (`add`'s check and write included)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._lock = threading.RLock()  # reentrant: `add` puts

    def get(self, key: K) -> V | None:
        with self._lock:
            return super().get(key)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            super().put(key, value)

    def add(self, key: K, value: V) -> bool:
        with self._lock:
            return super().add(key, value)

    def pop(self, key: K) -> V | None:
        with self._lock:
            return super().pop(key)

    def take_all(self) -> list[V]:
        with self._lock:
            return super().take_all()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return super().__contains__(key)
