"""kube/workqueue.py and kube/informer.Store: the virtual kubelet's reflection runs on them."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kube.informer import Store
from kube.workqueue import WorkQueue


def _until(check: Any, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_key_added_many_times_while_queued_is_handled_once_and_once_more_if_added_while_busy() -> None:
    handled: list[str] = []
    entered, release = threading.Event(), threading.Event()

    def handle(key: str) -> None:
        handled.append(key)
        if key == "slow" and len(handled) == 1:
            entered.set()
            release.wait(5)

    queue = WorkQueue("test", handle, workers=2).start()
    try:
        queue.add("slow")
        assert entered.wait(5)
        for _ in range(5):
            queue.add("slow")  # added while busy: handled again after, once
        queue.add_all(["a", "a", "a"])
        _until(lambda: "a" in handled)
        release.set()
        _until(lambda: handled.count("slow") == 2 and len(queue) == 0)
        time.sleep(0.1)
        assert sorted(handled) == ["a", "slow", "slow"]  # never two workers on one key, no duplicates
    finally:
        queue.stop()


def test_a_failed_key_comes_back_after_a_backoff() -> None:
    attempts: list[float] = []

    def handle(key: str) -> None:
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise RuntimeError("the API server said no")

    queue = WorkQueue("test", handle, workers=1).start()
    try:
        queue.add("k")
        _until(lambda: len(attempts) == 3)
        gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
        assert gaps[0] >= 0.45 and gaps[1] >= 0.95, gaps  # 0.5 s, then 1 s
    finally:
        queue.stop()


def test_a_store_reports_each_added_changed_and_removed_key_with_its_old_and_new_object() -> None:
    seen: list[tuple[str, Any, Any]] = []
    store: Store[str, dict[str, Any]] = Store(lambda o: o["name"], lambda k, old, new: seen.append((k, old, new)))
    store.sync([{"name": "a", "v": 1}, {"name": "b", "v": 1}])
    assert sorted(k for k, _, _ in seen) == ["a", "b"]
    seen.clear()
    store.sync([{"name": "a", "v": 1}, {"name": "c", "v": 1}])  # a relist: b gone, c new, a unchanged
    assert sorted(seen, key=lambda e: e[0]) == [("b", {"name": "b", "v": 1}, None), ("c", None, {"name": "c", "v": 1})]
    seen.clear()
    store.event("MODIFIED", {"name": "a", "v": 1})  # the watch repeats what is known: nothing to do
    store.event("MODIFIED", {"name": "a", "v": 2})
    store.event("DELETED", {"name": "c", "v": 1})
    assert seen == [("a", {"name": "a", "v": 1}, {"name": "a", "v": 2}), ("c", {"name": "c", "v": 1}, None)]
    assert store.get("a") == {"name": "a", "v": 2} and store.get("c") is None and len(store) == 1
    # What this process just created does not hide what the watch has told of it since.
    store.add_if_absent("a", {"name": "a", "v": 0})
    store.add_if_absent("d", {"name": "d", "v": 0})
    assert store.get("a") == {"name": "a", "v": 2} and store.get("d") == {"name": "d", "v": 0}


def test_a_failed_api_call_is_logged_with_the_servers_reason_and_message_bounded_and_printable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def handle(key: str) -> None:
        error = ApiException(status=409, reason="Conflict")
        error.body = json.dumps({"message": 'Operation cannot be fulfilled on resourcequotas "tidepool-offer"\x1b[2J'
                                            + "x" * 1000})  # fmt: skip
        raise error

    queue = WorkQueue("test", handle, workers=1).start()
    try:
        with caplog.at_level(logging.WARNING, logger="kube.workqueue"):
            queue.add("k")
            _until(lambda: any("failed" in r.getMessage() for r in caplog.records))
    finally:
        queue.stop()
    said = next(r.getMessage() for r in caplog.records if "failed" in r.getMessage())
    assert 'test: k failed: 409 Conflict: Operation cannot be fulfilled on resourcequotas "tidepool-offer" [2J' in said
    assert "\x1b" not in said and len(said) < 400


def test_one_owner_s_burst_does_not_hold_back_another_owner_s_key() -> None:
    """Owners take turns: a namespace that queued 1,000 keys delays another's one key by a turn, not by
    1,000 handlings (without `owner`, FIFO: it would come last)."""
    handled: list[tuple[str, int]] = []
    gate = threading.Event()

    def handle(key: tuple[str, int]) -> None:
        gate.wait(5)
        handled.append(key)

    queue: WorkQueue[tuple[str, int]] = WorkQueue("test", handle, workers=1, owner=lambda key: key[0]).start()
    try:
        queue.add_all(("busy", i) for i in range(1000))
        queue.add(("quiet", 0))
        gate.set()
        _until(lambda: len(handled) == 1001)
        # The first "busy" key may have been taken before "quiet" was added; "quiet" is next after at most one more.
        assert handled.index(("quiet", 0)) <= 2, handled[:5]
        assert [k for k in handled if k[0] == "busy"] == [("busy", i) for i in range(1000)]  # each owner in order
    finally:
        queue.stop()
