"""The one key memory of tidepool's watchers: per object, the key of what a workflow decides on, so that a
watcher signals only when that key changes, appears or goes (workers/consumer.py, workers/pool.py,
workers/decision_watch.py), or starts a workflow only when its input does (workers/provider.py).

Rules:
- A key of None is an object nobody follows (or one that is absent): it is not remembered.
- `event` says whether a watch event changed the key; a deletion of a remembered object does.
- `sync` (after a list or relist) returns the objects whose key changed (every one, the first time) and,
  as last seen, the remembered ones that are gone (deleted=True): a deletion missed while unwatched.
- `forget` is for a signal Temporal did not take: the next event or list of that object (of every
  object, without an identity) tells it again, even if nothing changed and even if it is gone.

Informers call it from their threads, failed signals from the event loop: it locks. Stateful, so it lives
here rather than in models/, which holds pure code; the keys it compares are models' views.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any

Obj = dict[str, Any]


def by_name(obj: Obj) -> Hashable:
    return str((obj.get("metadata") or {}).get("name"))


def by_namespace_and_name(obj: Obj) -> Hashable:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


class KeyMemory:
    def __init__(self, key: Callable[[Obj], Hashable | None], *,
                 identity: Callable[[Obj], Hashable] = by_name) -> None:  # fmt: skip
        self._key, self._identity = key, identity
        self._seen: dict[Hashable, tuple[Hashable, Obj]] = {}
        self._untold: set[Hashable] = set()  # signals that did not get through, by identity
        self._untold_all = False
        self._lock = threading.Lock()
        self.listed = False  # whether a list went through yet

    def see(self, identity: Hashable, key: Hashable | None, obj: Obj | None = None) -> bool:
        """Whether `key` (None: absent) is news for `identity`; the primitive `event` and `sync` use, and
        the one a watcher of a single object calls directly."""
        with self._lock:
            return self._see(identity, key, obj or {})

    def _see(self, identity: Hashable, key: Hashable | None, obj: Obj) -> bool:
        previous = self._seen.get(identity)
        untold = self._untold_all or identity in self._untold
        self._untold.discard(identity)
        if key is None:
            self._seen.pop(identity, None)
            return previous is not None or untold
        self._seen[identity] = (key, obj)
        return untold or previous is None or previous[0] != key

    def event(self, kind: str, obj: Obj) -> bool:
        key = None if kind == "DELETED" else self._key(obj)
        with self._lock:
            changed = self._see(self._identity(obj), key, obj)
            self._untold_all = self._untold_all and not changed
            return changed

    def sync(self, objects: Iterable[Obj]) -> list[tuple[Obj, bool]]:
        # An object nobody follows any more counts as gone, shown as it was last followed.
        listed = {self._identity(o): (key, o) for o in objects if (key := self._key(o)) is not None}
        with self._lock:
            gone = [(identity, self._seen[identity][1]) for identity in self._seen if identity not in listed]
            changed = [(obj, False) for identity, (key, obj) in listed.items() if self._see(identity, key, obj)]
            changed += [(obj, True) for identity, obj in gone if self._see(identity, None, obj)]
            for identity in self._untold - set(listed):  # gone before a failed signal: nothing left to show
                self._untold.discard(identity)
            self._untold_all, self.listed = False, True
            return changed

    def followed(self) -> list[Obj]:
        """Every object followed now, as last seen."""
        with self._lock:
            return [obj for _, obj in self._seen.values()]

    def forget(self, identity: Hashable | None = None) -> None:
        with self._lock:
            if identity is None:
                self._untold_all = True
                self._untold |= set(self._seen)
            else:
                self._untold.add(identity)
