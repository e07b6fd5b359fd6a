"""kube/informer.py and the list half of kube/streams.py: a client's list method turned into its request,
pages followed to the end, each object transformed as its page is parsed, handlers off the loop (the watch
half is exercised against real API servers by every env test)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes import client as k8s

from kube import compact as compacting
from kube.informer import Informer, Store, list_request
from kube.streams import PAGE_SIZE, list_then_watch

API = k8s.ApiClient(k8s.Configuration(host="https://api.example:6443/prefix"))


@pytest.mark.parametrize(("list_call", "kwargs", "path", "params"), [
    pytest.param(k8s.CoreV1Api(API).list_namespaced_pod, {"namespace": "x", "label_selector": "a=b,c"},
                 "/api/v1/namespaces/x/pods", {"labelSelector": "a=b,c"}, id="namespaced, with a label selector"),
    pytest.param(k8s.CoreV1Api(API).list_pod_for_all_namespaces, {"field_selector": "spec.nodeName=n"},
                 "/api/v1/pods", {"fieldSelector": "spec.nodeName=n"}, id="cluster-wide, with a field selector"),
    pytest.param(k8s.CustomObjectsApi(API).list_cluster_custom_object,
                 {"group": "g.io", "version": "v1", "plural": "things"}, "/apis/g.io/v1/things", {},
                 id="custom objects"),
])  # fmt: skip
def test_a_list_method_becomes_the_path_and_query_it_would_send(list_call: Any, kwargs: dict[str, str], path: str,
                                                                 params: dict[str, str]) -> None:  # fmt: skip
    assert list_request(list_call, **kwargs) == (API, path, params)


class _PagedEndpoint:
    """An API server whose list comes in three pages, and whose watch tells nothing until cancelled."""

    def __init__(self) -> None:
        self.asked: list[dict[str, str]] = []
        self.watched = asyncio.Event()
        self.watched_from = ""

    async def list(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        self.asked.append(params)
        pages = {None: ("p2", ["a", "b"]), "p2": ("p3", ["c"]), "p3": (None, ["d"])}
        following, names = pages[params.get("continue")]
        return {"metadata": {"resourceVersion": f"rv-{len(self.asked)}", **({"continue": following} if following else {})},
                "items": [{"metadata": {"name": n}, "spec": {"big": "x" * 100}} for n in names]}  # fmt: skip

    async def watch(self, path: str, params: dict[str, str], on_open: Any) -> AsyncIterator[tuple[str, Any]]:
        self.watched_from = params["resourceVersion"]
        self.watched.set()
        await asyncio.Event().wait()
        yield "MODIFIED", {}


async def _failed(failures: int) -> None:
    raise AssertionError(f"{failures} failures")


async def test_a_relist_follows_every_page_and_hands_over_the_transformed_objects_then_watches_from_the_last_version(
) -> None:  # fmt: skip
    endpoint = _PagedEndpoint()
    synced: list[list[str]] = []

    async def current() -> Any:
        return endpoint

    stream = asyncio.create_task(list_then_watch(
        "test", current, "/api/v1/pods", {"labelSelector": "a=b"}, on_sync=synced.append,
        on_event=lambda kind, obj: None, on_failure=_failed, transform=lambda obj: obj["metadata"]["name"],
    ))  # fmt: skip
    await asyncio.wait_for(endpoint.watched.wait(), 5)
    stream.cancel()
    assert synced == [["a", "b", "c", "d"]]
    assert endpoint.watched_from == "rv-3"
    assert [(k.get("continue"), k["limit"], k["labelSelector"]) for k in endpoint.asked] == [
        (None, str(PAGE_SIZE), "a=b"), ("p2", str(PAGE_SIZE), "a=b"), ("p3", str(PAGE_SIZE), "a=b")]


async def test_a_handler_that_blocks_holds_up_its_own_informer_only_and_runs_off_the_loop() -> None:
    loop_thread = threading.current_thread()
    release = threading.Event()
    ran_on: list[threading.Thread] = []
    told: list[str] = []

    def blocking(_kind: str, _obj: Any) -> None:
        ran_on.append(threading.current_thread())
        release.wait(5)

    slow: Informer[Any] = Informer("slow", k8s.CoreV1Api(API).list_node, on_sync=lambda _: None, on_event=blocking)
    fast: Informer[Any] = Informer("fast", k8s.CoreV1Api(API).list_node, on_sync=lambda _: None,
                                   on_event=lambda kind, _obj: told.append(kind))  # fmt: skip
    blocked = asyncio.create_task(slow._deliver(lambda: blocking("ADDED", {})))
    await asyncio.sleep(0.05)
    await asyncio.wait_for(fast._deliver(lambda: fast._on_event("ADDED", {})), 1)
    assert told == ["ADDED"] and not blocked.done()
    release.set()
    await blocked
    assert ran_on and ran_on[0] is not loop_thread
    slow.stop()
    await slow._deliver(lambda: told.append("after stop"))  # a stopped informer tells nobody anything more
    assert told == ["ADDED"]


def test_a_list_of_one_part_of_a_store_replaces_that_part_only_and_tells_each_change() -> None:
    """The virtual kubelet's copies of every provider namespace share a Store; each namespace's list is the whole
    truth for its own keys (workers/provider_watches.py), never for another namespace's."""
    told: list[tuple[tuple[str, str], bool, bool]] = []
    store: Store[tuple[str, str], dict[str, Any]] = Store(
        lambda o: (o["ns"], o["name"]), lambda key, old, new: told.append((key, old is not None, new is not None)))
    store.sync([{"ns": "a", "name": "x"}, {"ns": "b", "name": "y"}])
    told.clear()
    store.sync([{"ns": "a", "name": "z"}], within=lambda key: key[0] == "a")
    assert sorted(store.keys()) == [("a", "z"), ("b", "y")]
    assert sorted(told) == [(("a", "x"), True, False), (("a", "z"), False, True)]
    told.clear()
    store.sync([], within=lambda key: key[0] == "b")  # a namespace no longer watched: its objects leave
    assert store.keys() == [("a", "z")] and told == [(("b", "y"), True, False)]


def test_kept_objects_share_their_repeated_strings_and_the_table_stays_bounded() -> None:
    def parsed(name: str) -> dict[str, Any]:  # as each watch event is: a json.loads of its own
        obj: dict[str, Any] = json.loads(json.dumps({"metadata": {"name": name, "labels": {"app": "web"}},
                                                     "status": {"phase": "Running", "message": "x" * 100}}))  # fmt: skip
        return obj

    first, second = compacting.compact(parsed("a")), compacting.compact(parsed("b"))
    assert first == parsed("a") and second == parsed("b")  # the same values
    assert next(iter(first)) is next(iter(second))  # one "metadata"
    assert first["status"]["phase"] is second["status"]["phase"]  # one "Running"
    assert first["status"]["message"] is not second["status"]["message"]  # long values are not looked up
    for i in range(compacting.MAX_SHARED + 10):  # names a tenant chooses never grow the table without bound
        compacting.compact(f"name-{i}")
    assert len(compacting._shared) <= compacting.MAX_SHARED
