"""kube/informer.py's list: pages followed to the end, each object transformed as its page is parsed (the
watch half is exercised against real API servers by every env test)."""

from __future__ import annotations

import json
from typing import Any

from kube.informer import PAGE_SIZE, Informer, Store


class _Page:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


def test_a_relist_follows_every_page_and_hands_over_the_transformed_objects_with_the_last_version() -> None:
    pages = {None: ("p2", ["a", "b"]), "p2": ("p3", ["c"]), "p3": (None, ["d"])}
    asked: list[dict[str, Any]] = []

    def list_call(**kwargs: Any) -> _Page:
        asked.append(kwargs)
        following, names = pages[kwargs.get("_continue")]
        return _Page({"metadata": {"resourceVersion": f"rv-{len(asked)}", **({"continue": following} if following else {})},
                      "items": [{"metadata": {"name": n}, "spec": {"big": "x" * 100}} for n in names]})  # fmt: skip

    synced: list[list[str]] = []
    informer: Informer[str] = Informer("test", list_call, on_sync=synced.append, on_event=lambda kind, obj: None,
                                       transform=lambda obj: obj["metadata"]["name"], label_selector="a=b")  # fmt: skip
    assert informer._relist() == "rv-3"
    assert synced == [["a", "b", "c", "d"]]
    assert [(k.get("_continue"), k["limit"], k["label_selector"]) for k in asked] == [
        (None, PAGE_SIZE, "a=b"), ("p2", PAGE_SIZE, "a=b"), ("p3", PAGE_SIZE, "a=b")]


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
