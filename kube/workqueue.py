"""A work queue of keys served by a fixed number of threads, as controller-runtime's: a key waits in the
queue at most once however often it is added, one worker at a time handles it (a key added while it is
being handled is handled again after), and a failed key comes back after a backoff that doubles up to a
cap. Handlers are level-triggered: they read the current state of the key, so merging adds loses nothing.

Fair between owners: with `owner` (e.g. a key's namespace, which is one tenant's or one consumer's), ready
keys wait in one line per owner and the workers take one key of each owner in turn, so an owner that adds
10,000 keys delays another's next key by one turn, not by 10,000 handlings.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

from kubernetes.client.exceptions import ApiException

from models.enforcement import status_message

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 60.0
MAX_LOGGED_ERROR = 300  # an API server's message may be another cluster's words: bounded


def _why(error: Exception) -> str:
    """One line: for an API error its status, reason and the server's message (its first line is only
    "(409)", and a 409 may mean "there already" or "lost a race")."""
    if isinstance(error, ApiException):
        message = status_message(error.body)
        said = f"{error.status} {error.reason}" + (f": {message}" if message else "")
    else:
        said = str(error).splitlines()[0] if str(error) else repr(error)
    return "".join(c if c.isprintable() else " " for c in said[:MAX_LOGGED_ERROR])


def _everyone(key: Hashable) -> None:
    return None


def namespace_of(key: tuple[str, ...]) -> str:
    """The owner of a (namespace, ...) key."""
    return key[0]


class WorkQueue(Generic[K]):
    def __init__(self, name: str, handle: Callable[[K], None], *, workers: int,
                 owner: Callable[[K], Hashable] = _everyone) -> None:  # fmt: skip
        self.name = name
        self._handle = handle
        self._owner = owner
        self._workers = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        self._ready: OrderedDict[Hashable, deque[K]] = OrderedDict()  # owner -> its ready keys; the first is next
        self._queued: set[K] = set()
        self._busy: set[K] = set()
        self._again: set[K] = set()  # added while busy: queued again when its handler returns
        self._failures: dict[K, int] = {}
        self._retries: dict[K, float] = {}  # key -> monotonic time it may run again
        self._due: list[tuple[float, int, K]] = []  # heap of retries; an entry no longer in _retries is stale
        self._order = itertools.count()  # ties in the heap, whose keys need not be comparable
        self._cond = threading.Condition()
        self._stopped = False

    def start(self) -> WorkQueue[K]:
        for worker in self._workers:
            worker.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def add(self, key: K) -> None:
        with self._cond:
            self._add(key)

    def add_all(self, keys: Iterable[K]) -> None:
        with self._cond:
            for key in keys:
                self._add(key)

    def __len__(self) -> int:
        with self._cond:
            return len(self._queued) + len(self._retries)

    def _add(self, key: K) -> None:
        if key in self._busy:
            self._again.add(key)
        elif key not in self._queued:
            self._retries.pop(key, None)  # a change came: no reason to wait out the backoff
            self._queued.add(key)
            self._ready.setdefault(self._owner(key), deque()).append(key)
            self._cond.notify()

    def _pop_ready(self) -> K:
        owner, keys = next(iter(self._ready.items()))
        key = keys.popleft()
        if keys:
            self._ready.move_to_end(owner)  # the owner's next key waits for every other owner's turn
        else:
            del self._ready[owner]
        return key

    def _next(self) -> K | None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                while self._due and self._due[0][0] <= now:
                    due, _, key = heapq.heappop(self._due)
                    if self._retries.get(key) == due:
                        del self._retries[key]
                        self._add(key)
                if self._ready:
                    key = self._pop_ready()
                    self._queued.discard(key)
                    self._busy.add(key)
                    return key
                wait = (self._due[0][0] if self._due else now + BACKOFF_MAX_SECONDS) - now
                self._cond.wait(max(wait, 0.01))
            return None

    def _work(self) -> None:
        while (key := self._next()) is not None:
            failed = False
            try:
                self._handle(key)
            except Exception as e:  # noqa: BLE001 - the key comes back after a backoff; the log says why
                failed = True
                log.warning("%s: %s failed: %s", self.name, key, _why(e))
            with self._cond:
                self._busy.discard(key)
                if failed:
                    count = self._failures.get(key, 0) + 1
                    self._failures[key] = count
                    due = time.monotonic() + min(BACKOFF_BASE_SECONDS * 2 ** (count - 1), BACKOFF_MAX_SECONDS)
                    self._retries[key] = due
                    heapq.heappush(self._due, (due, next(self._order), key))
                    self._again.discard(key)
                    self._cond.notify()
                else:
                    self._failures.pop(key, None)
                    if key in self._again:
                        self._again.discard(key)
                        self._add(key)
