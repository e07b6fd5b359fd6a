"""A pool shared by two tenants, end to end on real clusters: two tenant control planes (t1's is the pool's
management cluster too), two super clusters, the real scheduler worker and one syncer per super cluster serving
both. Tenants with the same namespace names never touch each other's copies; a removed tenant leaves nothing
behind; under contention slices follow the tenants' weights, not who asked first; a tenant whose control plane
stops answering loses nothing, and what it holds stays held."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.objects import read_cluster_object
from models.names import (
    LABEL_SUPER_CLUSTER,
    LABEL_TENANT,
    LABEL_TENANT_NAMESPACE,
    PLACEMENT_STATUS_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    TENANTS,
    super_cluster_namespace,
    tenant_finalizer,
)
from tests.pool import TENANT, Pool, running_pool
from tests.running import eventually

pytestmark = [pytest.mark.env, pytest.mark.pool, pytest.mark.tenants]
SLICE = '{"cpu": "1", "memory": "2Gi"}'


def _namespace(api: k8s.ApiClient, name: str, *, slices: int) -> None:
    core = k8s.CoreV1Api(api)
    core.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": name,
                                                                      "annotations": {"pool.tidepool.io/slice": SLICE}}}))
    core.create_namespaced_resource_quota(name, k8s.V1ResourceQuota.model_validate(
        {"metadata": {"name": "quota"}, "spec": {"hard": {"cpu": str(slices), "memory": f"{2 * slices}Gi"}}}))


def _annotations(api: k8s.ApiClient, name: str) -> dict[str, str]:
    return dict(k8s.CoreV1Api(api).read_namespace(name).metadata.annotations or {})


def _placed(api: k8s.ApiClient, name: str) -> int:
    return sum(json.loads(_annotations(api, name).get(PLACEMENTS_ANNOTATION) or "{}").values())


def _copies(cluster: LocalCluster) -> dict[str, dict[str, str]]:
    """The namespaces a syncer made in a super cluster (not being deleted), with their tenant labels."""
    return {str(n.metadata.name): dict(n.metadata.labels or {}) for n in k8s.CoreV1Api(cluster.api_client())
            .list_namespace(label_selector=LABEL_TENANT).items if not n.metadata.deletion_timestamp}  # fmt: skip


def _tenant(pool: Pool, name: str) -> dict[str, Any]:
    obj = read_cluster_object(pool.tenant.api_client(), TENANTS, name)
    assert obj is not None, f"Tenant {name} is gone"
    return obj


def _ready(tenant: dict[str, Any]) -> tuple[str, str] | None:
    found = [c for c in (tenant.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"]
    return (found[0]["status"], found[0]["reason"]) if found else None


def _pod(api: k8s.ApiClient, namespace: str, name: str) -> None:
    k8s.CoreV1Api(api).create_namespaced_pod(namespace, k8s.V1Pod.model_validate({"metadata": {"name": name}, "spec": {
        "containers": [{"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}}))


def _virtual_nodes(api: k8s.ApiClient) -> set[str]:
    """The nodes the pool's syncers keep in a tenant's control plane."""
    return {str(n.metadata.name) for n in k8s.CoreV1Api(api).list_node(label_selector=LABEL_SUPER_CLUSTER).items}


def _ingress(api: k8s.ApiClient, name: str, host: str) -> None:
    k8s.NetworkingV1Api(api).create_namespaced_ingress("shop", k8s.V1Ingress.model_validate({"metadata": {"name": name},
        "spec": {"rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {
            "service": {"name": "web", "port": {"number": 80}}}}]}}]}}))  # fmt: skip


def _ingress_copies(cluster: LocalCluster, namespace: str) -> set[str]:
    return {str(i.metadata.name) for i in k8s.NetworkingV1Api(cluster.api_client()).list_namespaced_ingress(namespace).items}


def _running(api: k8s.ApiClient, namespace: str, name: str) -> bool:
    return k8s.CoreV1Api(api).read_namespaced_pod(name, namespace).status.phase == "Running"


async def test_two_tenants_with_the_same_namespaces_share_super_clusters_and_one_s_removal_leaves_the_other_whole(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str
) -> None:
    async with running_pool(localenv, make_cluster, unique, other_tenants={"t2": 1}) as pool:
        apis = {name: cluster.api_client() for name, cluster in pool.tenants.items()}
        # t2 writes the pool's annotations itself, on a namespace without a quota: a placement the scheduler never
        # made, on s1, with a pod there. The syncers follow the pool's records, not what a tenant writes.
        forged = json.dumps({"s1": 4})
        k8s.CoreV1Api(apis["t2"]).create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": "forged", "annotations": {
            PLACEMENTS_ANNOTATION: forged, "pool.tidepool.io/scheduled": forged,
            "pool.tidepool.io/placed-slice": SLICE}}}))  # fmt: skip
        k8s.CoreV1Api(apis["t2"]).create_namespaced_pod("forged", k8s.V1Pod.model_validate({"metadata": {
            "name": "web", "annotations": {"pool.tidepool.io/super-cluster": "s1"}},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]}}))  # fmt: skip
        for api in apis.values():
            _namespace(api, "shop", slices=2)
            k8s.CoreV1Api(api).create_namespaced_config_map("shop", k8s.V1ConfigMap.model_validate(
                {"metadata": {"name": "settings"}, "data": {"owner": "the same name in both"}}))  # fmt: skip
        for tenant, api in apis.items():
            await eventually(lambda a=api: _placed(a, "shop") == 2, timeout=90, what=f"{tenant}'s shop placed")
            _pod(api, "shop", "web")
        for tenant, api in apis.items():
            await eventually(lambda a=api: _running(a, "shop", "web"), timeout=90, what=f"{tenant}'s pod Running")

        # Each tenant's namespace has a copy of its own, named apart and labelled with its tenant.
        targets = {tenant: super_cluster_namespace(tenant, "shop") for tenant in apis}
        assert targets[TENANT] != targets["t2"]
        copies: dict[str, dict[str, str]] = {}
        for cluster in pool.supers.values():
            copies.update(_copies(cluster))
        assert {name: (labels[LABEL_TENANT], labels[LABEL_TENANT_NAMESPACE]) for name, labels in copies.items()} == {
            targets[TENANT]: (TENANT, "shop"), targets["t2"]: ("t2", "shop")}  # and nothing of t2's `forged`
        assert {f for f in _tenant(pool, "t2")["metadata"]["finalizers"]} >= {tenant_finalizer(n) for n in pool.supers
                                                                            if targets["t2"] in _copies(pool.supers[n])}

        # An Ingress host is the first tenant's in each super cluster: t2's Ingress for t1's host is not copied
        # where both have the namespace, and t2 is told; its Ingress for a host of its own is.
        shared = [c for c in pool.supers.values() if {targets[TENANT], targets["t2"]} <= set(_copies(c))]
        assert shared, "spread placement puts both shops on both super clusters"
        _ingress(apis[TENANT], "web", "shop.example.com")
        await eventually(lambda: all(_ingress_copies(c, targets[TENANT]) == {"web"} for c in shared), timeout=60,
                         what="t1's Ingress copied")  # fmt: skip
        _ingress(apis["t2"], "web", "shop.example.com")
        _ingress(apis["t2"], "own", "t2.example.com")
        await eventually(lambda: all(_ingress_copies(c, targets["t2"]) == {"own"} for c in shared), timeout=60,
                         what="t2's own Ingress copied")  # fmt: skip
        taken = await eventually(lambda: [e for e in k8s.CoreV1Api(apis["t2"]).list_namespaced_event("shop").items
                                          if e.reason == "IngressHostTaken" and e.involved_object.name == "web"],
                                 timeout=30, what="t2 told its host is taken")  # fmt: skip
        assert "shop.example.com" in taken[0].message and taken[0].type == "Warning"
        assert all(_ingress_copies(c, targets["t2"]) == {"own"} for c in shared)  # still not copied

        # t2's running pod is on a virtual node of its super cluster in t2's control plane (workers/tenant_nodes.py).
        t2_nodes = await eventually(lambda: _virtual_nodes(apis["t2"]), timeout=60, what="t2's virtual node")

        # t2 is removed: every super cluster lets it go once nothing of it is left there; t1's copies stay.
        k8s.CustomObjectsApi(pool.tenant.api_client()).delete_cluster_custom_object("tidepool.io", "v1alpha1", TENANTS, "t2")
        await eventually(lambda: read_cluster_object(pool.tenant.api_client(), TENANTS, "t2") is None, timeout=120,
                         what="Tenant t2 gone")  # fmt: skip
        for name, cluster in pool.supers.items():
            assert targets["t2"] not in _copies(cluster), f"{name} kept t2's namespace"
        assert t2_nodes and _virtual_nodes(apis["t2"]) == set(), "t2's virtual nodes outlived its Tenant"
        assert _running(apis[TENANT], "shop", "web")
        assert any(targets[TENANT] in _copies(cluster) for cluster in pool.supers.values())
        t1_copy = next(c for c in pool.supers.values() if targets[TENANT] in _copies(c))
        assert "settings" in {m.metadata.name for m in k8s.CoreV1Api(t1_copy.api_client()).list_namespaced_config_map(
            targets[TENANT]).items}  # fmt: skip


async def test_slices_follow_the_tenants_weights_not_who_asked_first_and_an_unreachable_tenant_keeps_what_it_holds(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str
) -> None:
    """The pool holds 8 slices (two clusters of 4). Both tenants ask for 6 one-slice namespaces in the same pass,
    t1's first: first come, first served would give t1 6 and t2 2; weights 1:3 give t1 2 and t2 6."""
    async with running_pool(localenv, make_cluster, unique, other_tenants={"t2": 3}) as pool:
        apis = {name: cluster.api_client() for name, cluster in pool.tenants.items()}
        pool.stop_worker()  # asks made while no pass runs: the next pass sees them all at once
        for tenant in (TENANT, "t2"):
            for i in range(6):
                _namespace(apis[tenant], f"ns-{i}", slices=1)
            await asyncio.sleep(1.1)  # t2's are younger by a second (creationTimestamp's resolution)
        pool.start_worker()

        def placed() -> dict[str, int] | None:
            # One read per namespace: the pass writes them one by one, so counts and verdicts from separate
            # reads could see a namespace undecided in one and decided in the other.
            seen = {t: [_annotations(apis[t], f"ns-{i}") for i in range(6)] for t in apis}
            if not all(PLACEMENT_STATUS_ANNOTATION in a for found in seen.values() for a in found):
                return None
            return {t: sum(sum(json.loads(a.get(PLACEMENTS_ANNOTATION) or "{}").values()) for a in found)
                    for t, found in seen.items()}

        counts = await eventually(placed, timeout=120, what="every namespace decided")
        assert counts == {TENANT: 2, "t2": 6}

        # t2's control plane stops: its copies keep running, its Tenant says so, and what it holds stays held.
        t2_copies = {name: [n for n in _copies(c) if _copies(c)[n][LABEL_TENANT] == "t2"] for name, c in pool.supers.items()}
        pool.stop_cluster(pool.tenants["t2"])
        try:
            _namespace(apis[TENANT], "later", slices=1)  # the pool is full: t2's slices are not free for t1
            await eventually(lambda: _ready(_tenant(pool, "t2")) == ("False", "Unreachable"), timeout=120,
                             what="Tenant t2 Unreachable")  # fmt: skip
            status = await eventually(lambda: _annotations(apis[TENANT], "later").get(PLACEMENT_STATUS_ANNOTATION),
                                      timeout=60, what="t1's new namespace decided")  # fmt: skip
            assert json.loads(status)["reason"] == "InsufficientCapacity"
            for name, cluster in pool.supers.items():
                assert set(t2_copies[name]) <= set(_copies(cluster)), f"{name} lost t2's copies"
        finally:
            pool.start_cluster(pool.tenants["t2"])
        await eventually(lambda: _ready(_tenant(pool, "t2")) == ("True", "Reachable"), timeout=180,
                         what="Tenant t2 Reachable again")  # fmt: skip
        assert {t: sum(_placed(apis[t], f"ns-{i}") for i in range(6)) for t in apis} == {TENANT: 2, "t2": 6}
