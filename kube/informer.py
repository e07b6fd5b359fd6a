"""An informer: one kind of object listed then watched, as raw JSON dicts, given as a Kubernetes client's
list method and its arguments (`core.list_pod_for_all_namespaces, label_selector=...`): how tidepool's
watchers, the capacity aggregate and the virtual kubelet follow an API server. A stream of kube/streams.py,
on the process's shared loop, carries it (pagination, transform per page, relist after 410 Gone, backoff);
this module turns the list method into the request it would send and runs the handlers off the loop.

Handlers run on a pool of threads beside the loop, one call of an informer at a time and in order, as on
the thread each informer used to have: a handler may block (a Kubernetes call, a lock held by a worker)
without holding up any other watch of the process. The pool's threads are made only as handlers overlap.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from kubernetes import client as k8s

from kube.compact import compact
from kube.streams import ClientEndpoint, StreamLoop, list_then_watch

log = logging.getLogger(__name__)

Obj = dict[str, Any]
RETRY_SECONDS = 2.0
# A list refused again and again (403: a permission the other cluster's tidepool does not grant yet) is
# tried again less and less often, up to this.
RETRY_MAX_SECONDS = 60.0
# Handlers of different informers that run at once: each informer has at most one call running, so this
# bounds only how many may block at the same moment.
HANDLER_THREADS = 32
T = TypeVar("T")

_handlers = concurrent.futures.ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="informer-handler")


def _as_is(obj: Obj) -> Any:
    return obj


class _Recorder:
    """Stands for a client's ApiClient: the generated method builds its request as for sending (path,
    query, through the client's own serialisation), and this hands it back instead."""

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._api_client = api_client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api_client, name)

    def param_serialize(self, *args: Any, **kwargs: Any) -> Any:
        # The plain client's: a client that refuses to serialise while its kubeconfig is refused (the virtual
        # kubelet's provider client) must still let its informers be built, to list once credentials come.
        return k8s.ApiClient.param_serialize(self._api_client, *args, **kwargs)

    def _call_with_legacy_options(self, request: Any, *_: Any) -> Any:
        return request


def list_request(list_call: Callable[..., Any], **list_kwargs: Any) -> tuple[k8s.ApiClient, str, dict[str, str]]:
    """The client, path and query of a generated client's list method called with these arguments."""
    api = copy.copy(list_call.__self__)  # type: ignore[attr-defined]
    client: k8s.ApiClient = api.api_client
    api.api_client = _Recorder(client)
    _method, url, *_ = getattr(api, list_call.__name__)(**list_kwargs)
    parts = urllib.parse.urlsplit(url[len(client.configuration.host.rstrip("/")):])
    return client, parts.path, dict(urllib.parse.parse_qsl(parts.query))


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
        self._api, self._path, self._params = list_request(list_call, **list_kwargs)
        self._on_sync = on_sync
        self._on_event = on_event
        self._transform = lambda obj: compact(transform(obj))  # kept for long: its repeated strings shared
        self._stopped = threading.Event()
        self._synced = threading.Event()
        self._running: concurrent.futures.Future[None] | None = None

    def start(self) -> Informer[T]:
        self._running = StreamLoop.shared().spawn(self._run())
        return self

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def stop(self) -> None:
        self._stopped.set()
        if self._running is not None:
            self._running.cancel()  # cancels the task on the streams' loop: its connection is closed

    async def _run(self) -> None:
        await list_then_watch(
            f"informer-{self.name}", ClientEndpoint(self._api), self._path, self._params, on_sync=self._sync,
            on_event=self._on_event, on_failure=_back_off, transform=self._transform, deliver=self._deliver,
        )  # fmt: skip

    def _sync(self, objects: list[T]) -> None:
        self._on_sync(objects)
        self._synced.set()

    async def _deliver(self, call: Callable[[], None]) -> None:
        await asyncio.get_running_loop().run_in_executor(_handlers, self._unless_stopped, call)

    def _unless_stopped(self, call: Callable[[], None]) -> None:
        if not self._stopped.is_set():  # a stopped informer tells nobody anything more (kube/lease.py)
            call()


async def _back_off(failures: int) -> None:
    delay = min(RETRY_SECONDS * 2 ** (failures - 1), RETRY_MAX_SECONDS)
    await asyncio.sleep(delay)


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
