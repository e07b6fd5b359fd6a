"""Tenant pods look like pods (workers/tenant_nodes.py), end to end on real clusters: a tenant control plane
without a kube-scheduler, two super clusters, the real pool worker and one syncer per super cluster. A tenant pod
that runs is bound to the virtual node of the node its copy runs on, which shows that node's capacity, is
Ready and heartbeaten; `kubectl logs` and `exec` with the tenant's kubeconfig reach the copy, while its kubelet
API refuses anyone but the tenant's API server; and the node goes once no pod of the tenant uses it."""

from __future__ import annotations

import datetime
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.lease import NODE_LEASE_NAMESPACE, NODE_LEASE_RENEW_SECONDS
from models.names import LABEL_SUPER_CLUSTER, POD_CLUSTER_ANNOTATION, tenant_node_name
from models.pool.tenant_nodes import NODE_UNUSED_GRACE_SECONDS
from tests.kube import client_certificate, kubelet_get
from tests.pool import running_pool
from tests.running import eventually

pytestmark = [pytest.mark.env, pytest.mark.pool, pytest.mark.tenants]
SLICE = '{"cpu": "1", "memory": "2Gi"}'


def _kubectl(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ensure_binaries().kubectl), "--kubeconfig", str(cluster.kubeconfig), "-n", "shop", *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def _kubelet_endpoint(node: k8s.V1Node) -> tuple[str, int]:
    address = next(a.address for a in node.status.addresses if a.type == "InternalIP")
    return address, node.status.daemon_endpoints.kubelet_endpoint.port


def _directory(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


async def test_a_running_tenant_pod_is_on_a_ready_virtual_node_and_kubectl_logs_and_exec_reach_its_copy(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str, tmp_path: Path
) -> None:
    async with running_pool(localenv, make_cluster, unique) as pool:
        core, api = pool.core, pool.tenant.api_client()
        core.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": "shop",
                                                                          "annotations": {"pool.tidepool.io/slice": SLICE}}}))
        core.create_namespaced_resource_quota("shop", k8s.V1ResourceQuota.model_validate(
            {"metadata": {"name": "quota"}, "spec": {"hard": {"cpu": "2", "memory": "4Gi"}}}))  # fmt: skip
        core.create_namespaced_pod("shop", k8s.V1Pod.model_validate({"metadata": {"name": "web"}, "spec": {
            "containers": [{"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}}))

        def bound_and_running() -> k8s.V1Pod | None:
            pod = core.read_namespaced_pod("web", "shop")
            return pod if pod.spec.node_name and pod.status.phase == "Running" else None

        pod = await eventually(bound_and_running, timeout=120, what="the tenant pod bound and Running")
        placed = pod.metadata.annotations[POD_CLUSTER_ANNOTATION]
        node_name = tenant_node_name(placed, f"{placed}-node")
        assert pod.spec.node_name == node_name

        # Its node: the physical node's capacity (4 CPU, 8Gi), Ready, tainted against any scheduler of the tenant.
        node = core.read_node(node_name)
        capacity, labels = node.status.capacity or {}, node.metadata.labels or {}
        assert (capacity.get("cpu"), capacity.get("memory")) == ("4", "8Gi")
        assert [(c.type, c.status) for c in node.status.conditions if c.type == "Ready"] == [("Ready", "True")]
        # Only its own taint, once the tenant's node-lifecycle controller has seen it Ready (not-ready goes).
        await eventually(lambda: [(t.key, t.effect) for t in core.read_node(node_name).spec.taints or []]
                         == [(LABEL_SUPER_CLUSTER, "NoSchedule")], timeout=60, what="the node's taints")  # fmt: skip
        assert (labels.get("type"), labels.get(LABEL_SUPER_CLUSTER)) == ("virtual-kubelet", placed)
        # The tenant runs no kube-scheduler: no stale FailedScheduling.
        events = core.list_namespaced_event("shop").items
        assert [e.message for e in events if e.reason == "FailedScheduling"] == []

        # kubectl, as the tenant runs it, reaches the copy on the super cluster's fake node.
        super_cluster = pool.supers[placed]
        logs = _kubectl(pool.tenant, "logs", "web")
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout == f"fake pod of cluster {super_cluster.name} started\n"
        done = _kubectl(pool.tenant, "exec", "web", "--", "sh", "-c", "echo in $TIDEPOOL_FAKE_POD_CLUSTER")
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"in {super_cluster.name}\n"

        # Its kubelet API answers the tenant's API server only. A user of the tenant without nodes/proxy is
        # forbidden; a certificate another cluster's CA signed (the super cluster's, an admin's at that) is
        # refused before any request: with it, the review on the tenant would have said yes to system:masters.
        endpoint = _kubelet_endpoint(core.read_node(node_name))
        logs_path = "/containerLogs/shop/web/web"
        nobody = client_certificate(pool.tenant, _directory(tmp_path / "tenant"), user="mallory", group="tenants")
        assert kubelet_get(endpoint, logs_path, nobody) == b"HTTP/1.1 403 Forbidden"
        stranger = client_certificate(super_cluster, _directory(tmp_path / "super"), user="admin", group="system:masters")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            kubelet_get(endpoint, logs_path, stranger)

        # The heartbeat: its Lease is renewed.
        leases = k8s.CoordinationV1Api(api)
        def renewed_at() -> datetime.datetime | None:  # its first renewal comes with the loop's next round
            try:
                return leases.read_namespaced_lease(node_name, NODE_LEASE_NAMESPACE).spec.renew_time
            except ApiException as e:
                if e.status == 404:
                    return None
                raise

        first = await eventually(renewed_at, timeout=3 * NODE_LEASE_RENEW_SECONDS, what="the node's Lease")
        await eventually(lambda: renewed_at() not in (None, first),
                         timeout=3 * NODE_LEASE_RENEW_SECONDS, what="the node's Lease renewed")  # fmt: skip

        # No pod of the tenant uses it any more: it goes, after the grace.
        core.delete_namespaced_pod("web", "shop", grace_period_seconds=0)

        def node_gone() -> bool:
            return node_name not in {n.metadata.name for n in core.list_node().items}

        await eventually(node_gone, timeout=NODE_UNUSED_GRACE_SECONDS + 90, what="the unused virtual node deleted")
