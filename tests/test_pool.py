"""The pool end to end on real clusters of the test's own: a tenant control plane and two super
clusters, the real scheduler worker and one syncer per super cluster."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import pytest
from kubernetes import client as k8s
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.objects import apply_cluster_object
from models.names import (
    API_VERSION,
    PLACEMENT_STATUS_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    POD_CLUSTER_ANNOTATION,
    SUPER_CLUSTERS,
    super_cluster_namespace,
)
from tests.pool import Pool, running_pool
from tests.replay import replay_all_runs
from tests.running import eventually
from tests.steady import history, settled_history

pytestmark = [pytest.mark.env, pytest.mark.pool]


@pytest.fixture
async def pool(localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str) -> AsyncIterator[Pool]:
    async with running_pool(localenv, make_cluster, unique) as running:
        yield running


def _tenant_namespace(api: k8s.ApiClient, name: str, *, cpu: str, memory: str) -> None:
    core = k8s.CoreV1Api(api)
    core.create_namespace(k8s.V1Namespace.model_validate(
        {"metadata": {"name": name, "annotations": {"pool.tidepool.io/slice": '{"cpu": "1", "memory": "2Gi"}'}}}))
    core.create_namespaced_resource_quota(name, k8s.V1ResourceQuota.model_validate(
        {"metadata": {"name": "quota"}, "spec": {"hard": {"cpu": cpu, "memory": memory}}}))


def _placement(api: k8s.ApiClient, name: str) -> dict[str, int]:
    placement: dict[str, int] = json.loads(
        (k8s.CoreV1Api(api).read_namespace(name).metadata.annotations or {}).get(PLACEMENTS_ANNOTATION) or "{}")
    return placement


def _has_namespace(cluster: LocalCluster, name: str) -> bool:
    return name in {n.metadata.name for n in k8s.CoreV1Api(cluster.api_client()).list_namespace().items
                    if not n.metadata.deletion_timestamp}  # fmt: skip


async def test_a_namespace_is_placed_as_slices_its_objects_follow_and_its_pod_runs_on_one_cluster(pool: Pool) -> None:
    api = pool.tenant.api_client()
    core = k8s.CoreV1Api(api)
    _tenant_namespace(api, "shop", cpu="6", memory="12Gi")  # 6 slices: more than one cluster holds
    placement = await eventually(lambda: _placement(api, "shop"), timeout=60, what="the placement")
    assert sum(placement.values()) == 6 and set(placement) == {"s1", "s2"}
    core.create_namespaced_config_map("shop", k8s.V1ConfigMap.model_validate({"metadata": {"name": "settings"}, "data": {"a": "b"}}))
    for name, cluster in pool.supers.items():
        await eventually(lambda c=cluster: "settings" in {m.metadata.name for m in
                         k8s.CoreV1Api(c.api_client()).list_namespaced_config_map(super_cluster_namespace("t1", "shop")).items},
                         timeout=30, what=f"the ConfigMap on {name}")  # fmt: skip

    core.create_namespaced_pod("shop", k8s.V1Pod.model_validate({"metadata": {"name": "web"}, "spec": {
        "containers": [{"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}))
    chosen = await eventually(lambda: (core.read_namespaced_pod("web", "shop").metadata.annotations or {}).get(
        POD_CLUSTER_ANNOTATION), timeout=30, what="the pod's super cluster")  # fmt: skip
    pod = await eventually(lambda: (p := core.read_namespaced_pod("web", "shop")).status.phase == "Running" and p,
                           timeout=60, what="the tenant to see the pod Running")  # fmt: skip
    assert pod.status.pod_ip
    others = [n for n in pool.supers if n != chosen]
    for name in others:  # exactly one super cluster runs it
        assert "web" not in {p.metadata.name for p in k8s.CoreV1Api(pool.supers[name].api_client())
                             .list_namespaced_pod(super_cluster_namespace("t1", "shop")).items}  # fmt: skip

    # Shrinking the quota shrinks the placement; a cluster that leaves it loses its copy.
    core.patch_namespaced_resource_quota("quota", "shop", {"spec": {"hard": {"cpu": "2", "memory": "4Gi"}}})
    shrunk = await eventually(lambda: (p := _placement(api, "shop")) and sum(p.values()) == 2 and p, timeout=60,
                              what="the placement to shrink")  # fmt: skip
    for name, cluster in pool.supers.items():
        if name not in shrunk:
            await eventually(lambda c=cluster: not _has_namespace(c, super_cluster_namespace("t1", "shop")), timeout=60, what=f"{name}'s copy gone")


async def test_a_namespace_that_fits_nowhere_is_not_placed_and_says_why(pool: Pool) -> None:
    api = pool.tenant.api_client()
    _tenant_namespace(api, "huge", cpu="20", memory="40Gi")
    status = await eventually(lambda: (k8s.CoreV1Api(api).read_namespace("huge").metadata.annotations or {}).get(
        PLACEMENT_STATUS_ANNOTATION), timeout=60, what="the placement status")  # fmt: skip
    assert json.loads(status)["reason"] == "InsufficientCapacity"
    assert _placement(api, "huge") == {}
    for cluster in pool.supers.values():
        assert not _has_namespace(cluster, super_cluster_namespace("t1", "huge"))  # nothing partial


async def test_the_scheduler_history_replays(pool: Pool, temporal_client: Client, unique: str) -> None:
    _tenant_namespace(pool.tenant.api_client(), "replayed", cpu="1", memory="2Gi")
    await eventually(lambda: _placement(pool.tenant.api_client(), "replayed"), timeout=60, what="the placement")
    await replay_all_runs(temporal_client, f"pool-scheduler-{unique}")


async def test_a_hundred_namespaces_created_at_once_never_overcommit_a_cluster(pool: Pool) -> None:
    api = pool.tenant.api_client()
    apply_cluster_object(api, SUPER_CLUSTERS, {"apiVersion": API_VERSION, "kind": "SuperCluster", "metadata": {"name": "s1"},
        "spec": {"kubeConfigRef": {"name": "super-s1", "namespace": "tidepool-system"},
                 "headroom": {"cpu": "1", "memory": "2Gi"}}})  # fmt: skip
    for i in range(100):
        _tenant_namespace(api, f"burst-{i}", cpu="1", memory="2Gi")  # one slice each; the pool holds 3 + 4

    def settled() -> dict[str, int] | None:
        per_cluster: dict[str, int] = {}
        decided = 0
        for namespace in k8s.CoreV1Api(api).list_namespace().items:
            annotations = namespace.metadata.annotations or {}
            if not namespace.metadata.name.startswith("burst-"):
                continue
            if PLACEMENTS_ANNOTATION in annotations or PLACEMENT_STATUS_ANNOTATION in annotations:
                decided += 1
            for cluster, count in json.loads(annotations.get(PLACEMENTS_ANNOTATION) or "{}").items():
                per_cluster[cluster] = per_cluster.get(cluster, 0) + count
        # Full: a cluster the prober found slow for a moment (Suspect) takes its slices once Ready again.
        return per_cluster if decided == 100 and sum(per_cluster.values()) >= 7 else None

    per_cluster = await eventually(settled, timeout=180, interval=1, what="every namespace decided, the pool full")
    assert per_cluster == {"s1": 3, "s2": 4}  # never beyond capacity minus headroom


@pytest.mark.steady
async def test_the_scheduler_sleeps_through_pod_status_and_quota_usage_churn_and_wakes_on_a_quota_change(
    pool: Pool, temporal_client: Client, unique: str
) -> None:
    api = pool.tenant.api_client()
    core = k8s.CoreV1Api(api)
    _tenant_namespace(api, "steady", cpu="2", memory="4Gi")
    await eventually(lambda: _placement(api, "steady"), timeout=60, what="the placement")
    core.create_namespaced_pod("steady", k8s.V1Pod.model_validate({"metadata": {"name": "web"}, "spec": {
        "containers": [{"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}}))
    await eventually(lambda: core.read_namespaced_pod("web", "steady").status.phase == "Running", timeout=60,
                     what="the pod Running")  # fmt: skip
    handle = temporal_client.get_workflow_handle(f"pool-scheduler-{unique}")
    settled = await settled_history(temporal_client, handle.id)

    for i in range(30):  # 30 s of what a running pool does all day: pod statuses and quota usage move
        core.patch_namespaced_pod_status("web", "steady", {"status": {"conditions": [
            {"type": "Ready", "status": "True" if i % 2 else "False", "message": f"churn {i}"}]}})  # fmt: skip
        core.patch_namespaced_resource_quota_status("quota", "steady", {"status": {
            "hard": {"cpu": "2", "memory": "4Gi"}, "used": {"cpu": f"{i}m", "memory": f"{i}Mi"}}})  # fmt: skip
        await asyncio.sleep(1)
    churned = await history(temporal_client, handle.id)
    assert len(churned) == len(settled), [e.event_type for e in churned[len(settled):]]

    core.patch_namespaced_resource_quota("quota", "steady", {"spec": {"hard": {"cpu": "4", "memory": "8Gi"}}})
    await eventually(lambda: sum(_placement(api, "steady").values()) == 4, timeout=30, what="the placement to grow")
    woken = await settled_history(temporal_client, handle.id)
    signals = [e for e in woken[len(settled):] if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED]
    assert signals, "the quota's spec change signalled the scheduler"
    await replay_all_runs(temporal_client, handle.id)
