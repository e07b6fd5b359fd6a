"""The pool's pod placer (workers/pod_placer.py) on a real tenant control plane, without a scheduling pass
or a workflow: new pods get a super cluster from the pool's record of their namespace, never more than the
slices there hold; a pod that fits nowhere is told so and waits, and gets a cluster once another pod frees
room."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import LocalCluster, create_cluster, delete_cluster
from deploy.localenv.env import EnvState
from kube.tenant_identity import add_tenant
from kube.tenants import TenantRegistry
from models.names import GROUP, POD_CLUSTER_ANNOTATION, SYSTEM_NAMESPACE, TENANTS, VERSION
from tests.kube import create_namespace, wait_for
from workers.pod_placer import PodPlacer

pytestmark = [pytest.mark.env, pytest.mark.pool, pytest.mark.tenants]
TENANT, NAMESPACE = "t1", "shop"


def _pod(core: k8s.CoreV1Api, name: str) -> None:
    core.create_namespaced_pod(NAMESPACE, k8s.V1Pod.model_validate({"metadata": {"name": name}, "spec": {
        "containers": [{"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}}))  # fmt: skip


def _clusters(core: k8s.CoreV1Api) -> dict[str, str | None]:
    return {str(p.metadata.name): (p.metadata.annotations or {}).get(POD_CLUSTER_ANNOTATION)
            for p in core.list_namespaced_pod(NAMESPACE).items}  # fmt: skip


@pytest.fixture
def tenant_plane(localenv: EnvState, unique: str) -> Iterator[LocalCluster]:
    """A tenant control plane as the pool requires it: no kube-scheduler (its pods are the pool's to place)."""
    binaries, workdir, name = ensure_binaries(), Path(localenv.state_dir) / "kwok", f"tenant-{unique}"
    try:
        yield create_cluster(name, binaries=binaries, workdir=workdir, scheduler=False)
    finally:
        delete_cluster(name, binaries=binaries, workdir=workdir)


def test_new_pods_are_placed_without_a_pass_never_beyond_the_slices_and_a_waiting_one_when_room_frees(
    tenant_plane: LocalCluster,
) -> None:
    cluster = tenant_plane
    api = cluster.api_client()
    core = k8s.CoreV1Api(api)
    create_namespace(api, SYSTEM_NAMESPACE)
    add_tenant(api, api, TENANT)  # its control plane is the management cluster too, as in tests/pool.py
    # The pool's record, as a pass writes it: `shop` holds one slice of 1 CPU / 2Gi on s1 and one on s2.
    k8s.CustomObjectsApi(api).patch_cluster_custom_object_status(GROUP, VERSION, TENANTS, TENANT, {"status": {
        "placements": {NAMESPACE: {"placement": {"s1": 1, "s2": 1}, "slice": {"cpu": "1", "memory": "2Gi"}}}}})  # fmt: skip
    create_namespace(api, NAMESPACE)
    wait_for(lambda: core.list_namespaced_service_account(NAMESPACE).items, timeout=30, what="shop's ServiceAccount")

    followers: dict[str, Any] = {}
    registry = TenantRegistry(api, name="test-placer", changed=lambda t: followers["placer"].tenant_changed(t),
                              tenant_object_changed=lambda t, o, n: followers["placer"].records_changed(t, o, n))  # fmt: skip
    told: list[set[str]] = []  # the clusters each round placed pods on (the pool worker wakes a pass if one drains)
    followers["placer"] = placer = PodPlacer(registry, placed=told.append)
    placer.start()
    registry.start()
    try:
        assert registry.wait_synced(30)
        for i in range(5):  # 5 pods of half a slice each: 4 fit
            _pod(core, f"web-{i}")
            time.sleep(0.05)  # distinct ages (creationTimestamp has second resolution; names break ties)
        wait_for(lambda: sum(c is not None for c in _clusters(core).values()) >= 4,
                 timeout=30, what="4 pods placed")
        time.sleep(3)  # the fifth stays waiting: the slices hold no more
        placed = _clusters(core)
        counts = {c: list(placed.values()).count(c) for c in ("s1", "s2", None)}
        assert counts == {"s1": 2, "s2": 2, None: 1}, placed
        assert set().union(*told) == {"s1", "s2"}, told
        waiting = next(name for name, c in placed.items() if c is None)
        # Told at once, as a scheduler tells it, not at the next pass: Pending, Unschedulable, an Event.
        scheduled = next(c for c in core.read_namespaced_pod_status(waiting, NAMESPACE).status.conditions or []
                         if c.type == "PodScheduled")  # fmt: skip
        assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable"), scheduled
        assert "InsufficientQuota" in (scheduled.message or ""), scheduled.message
        events = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={waiting}").items
        assert [e.reason for e in events if e.type == "Warning"] == ["FailedScheduling"], events

        gone = next(name for name, c in placed.items() if c == "s1")
        core.delete_namespaced_pod(gone, NAMESPACE, grace_period_seconds=0)
        wait_for(lambda: _clusters(core).get(waiting) == "s1", timeout=30, what=f"{waiting} placed in the room freed")
        after = _clusters(core)
        assert {c: list(after.values()).count(c) for c in ("s1", "s2", None)} == {"s1": 2, "s2": 2, None: 0}, after
        assert told[-1] == {"s1"}, told  # the round that placed the waiting pod
    finally:
        placer.stop()
        registry.stop()
