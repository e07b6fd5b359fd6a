"""What wakes the pool scheduler: the keys of what a pass reads, and the change detector the watchers
run every event and relist through. Pure: no cluster."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import pytest

from kube.keys import KeyMemory, by_namespace_and_name
from models.names import (
    MANDATORY_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    POLICY_ANNOTATION,
    SCHEDULED_ANNOTATION,
    SLICE_ANNOTATION,
)
from models.pool.triggers import namespace_key, pod_key, pool_config_key, quota_key, super_cluster_key

pytestmark = [pytest.mark.pool, pytest.mark.steady]
Obj = dict[str, Any]


def _ns(annotations: dict[str, str] | None = None, **meta: Any) -> Obj:
    return {"metadata": {"name": "shop", "uid": "u1", "resourceVersion": "1", "annotations": annotations or {}, **meta}}


def _quota(hard: dict[str, str], used: dict[str, str] | None = None) -> Obj:
    return {"metadata": {"name": "quota", "namespace": "shop", "uid": "q1"}, "spec": {"hard": hard},
            "status": {"hard": hard, "used": used or {}}}  # fmt: skip


def _pod(phase: str = "Running", **meta: Any) -> Obj:
    return {"metadata": {"name": "web", "namespace": "shop", "uid": "p1", **meta},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip


PLACED = '{"s1": 2}'
MOVED = {"pool.tidepool.io/super-cluster": "s2", "pool.tidepool.io/moved-from": "s1"}


def _config(pool: dict[str, Any]) -> Obj:
    return {"metadata": {"name": "tidepool", "uid": "c1"}, "spec": {"pool": pool}}


@pytest.mark.parametrize(
    ("key", "before", "after", "wakes"),
    [
        pytest.param(quota_key, _quota({"cpu": "2"}, {"cpu": "0"}), _quota({"cpu": "2"}, {"cpu": "1"}), False,
                     id="a quota's status.used moving with its pods wakes nobody"),
        pytest.param(quota_key, _quota({"cpu": "2"}), _quota({"cpu": "4"}), True, id="a quota's spec.hard wakes"),
        pytest.param(pod_key, _pod("Pending"), _pod("Running", resourceVersion="9"), False,
                     id="a pod starting wakes nobody"),
        pytest.param(pod_key, _pod(), _pod(annotations={"pool.tidepool.io/super-cluster": "s1"}), False,
                     id="the scheduler placing a pod wakes nobody"),
        pytest.param(pod_key, _pod(), _pod("Succeeded"), True, id="a pod that ends frees capacity and wakes"),
        pytest.param(pod_key, _pod(), _pod(deletionTimestamp="2026-01-01T00:00:00Z"), True,
                     id="a pod being deleted frees capacity and wakes"),
        pytest.param(pod_key, _pod("Pending", annotations=MOVED), _pod("Running", annotations=MOVED), True,
                     id="a moved pod whose new copy runs wakes: its move can finish"),
        pytest.param(pod_key, _pod("Pending", annotations=MOVED), _pod("Pending", resourceVersion="9", annotations=MOVED),
                     False, id="a moved pod's status churn before it runs wakes nobody"),
        pytest.param(pod_key, _pod(annotations=MOVED), _pod(annotations={}), False,
                     id="the end of a move clearing moved-from wakes nobody"),
        pytest.param(namespace_key, _ns({SLICE_ANNOTATION: "a"}), _ns({SLICE_ANNOTATION: "b"}), True,
                     id="a changed slice wakes"),
        pytest.param(namespace_key, _ns(), _ns({PLACEMENTS_ANNOTATION: PLACED, SCHEDULED_ANNOTATION: PLACED}), False,
                     id="the scheduler's own placement wakes nobody"),
        pytest.param(namespace_key, _ns({PLACEMENTS_ANNOTATION: PLACED, SCHEDULED_ANNOTATION: PLACED}),
                     _ns({PLACEMENTS_ANNOTATION: '{"s2": 2}', SCHEDULED_ANNOTATION: PLACED}), True,
                     id="a placement the user edited wakes"),
        pytest.param(namespace_key, _ns({PLACEMENTS_ANNOTATION: PLACED, SCHEDULED_ANNOTATION: PLACED}),
                     _ns({SCHEDULED_ANNOTATION: PLACED}), True, id="a placement the user cleared wakes"),
        pytest.param(namespace_key, _ns(), _ns({"pool.tidepool.io/placement-status": "{}"}, labels={"a": "b"}),
                     False, id="the scheduler's status and labels no pass reads wake nobody"),
        pytest.param(namespace_key, _ns(), _ns(deletionTimestamp="2026-01-01T00:00:00Z"), True,
                     id="a namespace being deleted wakes"),
        pytest.param(namespace_key, _ns(), _ns({POLICY_ANNOTATION: "pack"}), True, id="a namespace's policy wakes"),
        pytest.param(namespace_key, _ns({PLACEMENTS_ANNOTATION: PLACED, SCHEDULED_ANNOTATION: PLACED}),
                     _ns({PLACEMENTS_ANNOTATION: PLACED, SCHEDULED_ANNOTATION: PLACED, MANDATORY_ANNOTATION: PLACED}),
                     False, id="the scheduler honouring an edit as mandatory wakes nobody"),
        pytest.param(pool_config_key, _config({"policy": "spread"}), _config({"policy": "pack"}), True,
                     id="the pool's policy wakes"),
        pytest.param(pool_config_key, _config({}), _config({"headroomPercent": 20}), True,
                     id="the pool's headroom percent wakes"),
        pytest.param(pool_config_key, _config({}), {**_config({}), "spec": {"pool": {}, "outgoing": {}},
                                                    "status": {"conditions": []}}, False,
                     id="the ClusterConfig's other parts and status wake nobody"),
        pytest.param(super_cluster_key, {"metadata": {"name": "s1"}, "spec": {"headroom": {"cpu": "1"}}},
                     {"metadata": {"name": "s1"}, "spec": {"headroom": {"cpu": "2"}}}, True,
                     id="a super cluster's headroom wakes"),
        pytest.param(super_cluster_key, {"metadata": {"name": "s1"}, "spec": {}},
                     {"metadata": {"name": "s1"}, "spec": {}, "status": {"conditions": [{"type": "Ready"}]}}, False,
                     id="a super cluster's status wakes nobody"),
    ],
)  # fmt: skip
def test_only_what_a_pass_reads_wakes_the_scheduler(
    key: Callable[[Obj], Hashable], before: Obj, after: Obj, wakes: bool
) -> None:
    keys = KeyMemory(key, identity=by_namespace_and_name)
    # The first list tells every object followed (a live pod is not: the pod placer's).
    assert keys.sync([before]) == ([] if key(before) is None else [(before, False)])
    assert keys.event("MODIFIED", after) is wakes


def test_arrivals_and_departures_wake_and_a_relist_that_finds_the_same_wakes_nobody() -> None:
    keys = KeyMemory(pod_key, identity=by_namespace_and_name)
    assert not keys.listed  # the watcher signals its first list whatever it holds: it starts the scheduler
    assert not keys.sync([])
    assert keys.listed
    assert keys.event("ADDED", _pod("Failed"))
    assert not keys.sync([_pod("Failed", resourceVersion="10")])  # a relist after a broken watch
    assert keys.sync([])  # deleted while the watch was down
    assert not keys.event("DELETED", _pod("Failed"))  # already known to be gone
    assert keys.event("ADDED", _pod("Pending", annotations=MOVED))
    assert keys.event("DELETED", _pod("Pending", annotations=MOVED))
    assert keys.event("ADDED", _pod("Succeeded"))
    assert keys.sync([_pod("Succeeded", uid="p2")])  # replaced under the same name while nobody watched


def test_a_new_live_pod_is_the_pod_placers_and_wakes_no_pass() -> None:
    keys = KeyMemory(pod_key, identity=by_namespace_and_name)
    assert not keys.sync([_pod("Pending")])
    assert not keys.event("ADDED", _pod("Pending", name="api"))  # a burst's pod: the placer places it
    assert not keys.event("MODIFIED", _pod("Pending", name="api", annotations={"pool.tidepool.io/super-cluster": "s1"}))
    assert not keys.event("DELETED", _pod("Pending", name="api"))  # the placer sees the room it leaves
    assert keys.event("MODIFIED", _pod("Succeeded"))  # an end is what a pass decides on


def test_a_change_whose_signal_failed_is_told_again_at_the_next_event_even_unchanged() -> None:
    keys = KeyMemory(pod_key, identity=by_namespace_and_name)
    assert keys.sync([_pod("Succeeded")])
    keys.forget()  # the signal did not get through
    assert keys.event("MODIFIED", _pod("Succeeded", resourceVersion="11"))
    assert not keys.event("MODIFIED", _pod("Succeeded", resourceVersion="12"))  # told: quiet again


def test_a_deletion_whose_signal_failed_is_told_again() -> None:
    keys = KeyMemory(pod_key, identity=by_namespace_and_name)
    assert keys.event("ADDED", _pod("Succeeded"))
    assert keys.event("DELETED", _pod("Succeeded"))
    keys.forget(("shop", "web"))
    assert keys.event("DELETED", _pod("Succeeded"))  # the same deletion, seen again by a new watch
    assert not keys.event("DELETED", _pod("Succeeded"))


def test_pods_of_two_namespaces_with_one_name_are_two_objects() -> None:
    ended, other = _pod("Succeeded"), _pod("Succeeded", namespace="other", uid="p9")
    keys = KeyMemory(pod_key, identity=by_namespace_and_name)
    assert keys.sync([ended, other]) == [(ended, False), (other, False)]
    assert keys.sync([ended]) == [(other, True)]
