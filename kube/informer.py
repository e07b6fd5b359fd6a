"""List-then-watch of one kind of object, as raw JSON dicts, in a background thread: how tidepool follows
an API server (the capacity aggregate, the workers' watchers). The provider's many one-object watches of
foreign clusters are streams on one event loop instead (kube/streams.py), which keep the same contract.

Level-triggered, like controller-runtime's informers: after every (re)list the handler gets the full
set of objects (`on_sync`), then each change (`on_event`). A watch that expires (410 Gone) or breaks is
answered by a fresh list, so a missed event can only delay a handler, never mislead it. Lists are
paginated and parsed with `json.loads` rather than the client's model deserialisation, which is ten
times slower on large clusters. An optional `transform` (client-go's) turns each object into what the
handler keeps as soon as its page is parsed, so a list of 100,000 pods is never held whole.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from kubernetes import watch

log = logging.getLogger(__name__)

Obj = dict[str, Any]
PAGE_SIZE = 5000
WATCH_TIMEOUT_SECONDS = 300
RETRY_SECONDS = 2.0
# A list refused again and again (403: a permission the other cluster's tidepool does not grant yet) is
# tried again less and less often, up to this.
RETRY_MAX_SECONDS = 60.0
T = TypeVar("T")


def _as_is(obj: Obj) -> Any:
    return obj


class Informer(Generic[T]):
    def __init__(
        self,
        name: str,
        list_call: Callable[..., Any],
        *,
        on_sync: Callable[[list[T]], None],
        on_event: Callable[[str, T], None],
        transform: Callable[[Obj], T] = _as_is,
        **list_kwargs: Any,
    ) -> None:
        self.name = name
        self._list_call = list_call
        self._list_kwargs = list_kwargs
        self._on_sync = on_sync
        self._on_event = on_event
        self._transform = transform
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{name}", daemon=True)

    def start(self) -> Informer[T]:
        self._thread.start()
        return self

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._relist()
            except Exception as e:  # noqa: BLE001 - a watcher must outlive any one failure
                failures += 1
                delay = min(RETRY_SECONDS * 2 ** (failures - 1), RETRY_MAX_SECONDS)
                log.warning("informer %s: list failed: %s; again in %.0f s", self.name, e, delay)
                self._stop.wait(delay)
                continue
            failures = 0
            self._synced.set()
            try:
                self._follow(version)
            except Exception as e:  # noqa: BLE001 - expired (410) or broken: a fresh list is the truth
                log.info("informer %s: watch ended (%s); listing again", self.name, e)

    def _relist(self) -> str:
        items: list[T] = []
        token: str | None = None
        while True:
            kwargs = dict(self._list_kwargs, limit=PAGE_SIZE, _preload_content=False)
            if token:
                kwargs["_continue"] = token
            page = json.loads(self._list_call(**kwargs).data)
            items.extend(map(self._transform, page.get("items", [])))
            metadata = page.get("metadata", {})
            del page  # one parsed page at a time
            token = metadata.get("continue")
            if not token:
                if not self._stop.is_set():  # a stopped informer tells nobody anything more (kube/lease.py)
                    self._on_sync(items)
                return str(metadata["resourceVersion"])

    def _follow(self, version: str) -> None:
        while not self._stop.is_set():
            self._watch = watch.Watch()
            # The client raises on an ERROR event (410 Gone among them); _run answers with a new list.
            for event in self._watch.stream(
                self._list_call, resource_version=version, allow_watch_bookmarks=True,
                timeout_seconds=WATCH_TIMEOUT_SECONDS, deserialize=False, **self._list_kwargs,
            ):  # fmt: skip
                kind, obj = event["type"], event["object"]
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if self._stop.is_set():
                    return
                if kind != "BOOKMARK":
                    self._on_event(kind, self._transform(obj))


K = TypeVar("K")


class Store(Generic[K, T]):
    """An informer's objects by key (client-go's indexer, one index), and a callback for every key that
    was added, changed or removed, with its old and new object (None when absent): what feeds a work
    queue. Thread-safe: informers write, workers read."""

    def __init__(self, key: Callable[[T], K | None], on_change: Callable[[K, T | None, T | None], None]) -> None:
        self._key = key
        self._on_change = on_change
        self._items: dict[K, T] = {}
        self._lock = threading.Lock()

    def get(self, key: K) -> T | None:
        return self._items.get(key)

    def add_if_absent(self, key: K, obj: T) -> None:
        """An object this process just created, ahead of its watch event: unless the watch has told of it
        already, which may be of a later state (a pod's copy scheduled and running before the create
        call's answer is read), never to be told again."""
        with self._lock:
            self._items.setdefault(key, obj)

    def values(self) -> list[T]:
        with self._lock:
            return list(self._items.values())

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def sync(self, objects: list[T], *, within: Callable[[K], bool] | None = None) -> None:
        """The full set of objects, after a list; with `within`, of the part of the store whose keys it
        accepts (one of several lists that share a store, each of its own namespace), the rest kept."""
        fresh = {key: obj for obj in objects if (key := self._key(obj)) is not None}
        with self._lock:
            if within is None:
                old, self._items = self._items, fresh
            else:
                old = {key: obj for key, obj in self._items.items() if within(key)}
                for key in old:
                    del self._items[key]
                self._items.update(fresh)
        for key in old.keys() - fresh.keys():
            self._on_change(key, old[key], None)
        for key, obj in fresh.items():
            if old.get(key) != obj:
                self._on_change(key, old.get(key), obj)

    def event(self, kind: str, obj: T) -> None:
        key = self._key(obj)
        if key is None:
            return
        with self._lock:
            old = self._items.pop(key, None) if kind == "DELETED" else self._items.get(key)
            if kind != "DELETED":
                self._items[key] = obj
        if kind == "DELETED":
            self._on_change(key, old if old is not None else obj, None)
        elif old != obj:
            self._on_change(key, old, obj)
