"""A tenant's virtual nodes: in each tenant control plane, one Node per physical node of a super cluster that
runs the tenant's pods, as virtualcluster's syncer makes them, so that a tenant pod shows where it runs and its
API server reaches a kubelet API (logs, exec, port-forward) for it. Pure: workers/tenant_nodes.py reads both
sides, calls these and writes.

A tenant control plane runs no kube-scheduler (the pool is its scheduler): the syncer binds a tenant pod to
the virtual node of the node its copy was scheduled on. A NoSchedule taint keeps any scheduler a tenant runs
anyway from placing a pod there. A node goes once no pod of the tenant is bound to it and no copy of the
tenant's runs on its physical node, after NODE_UNUSED_GRACE_SECONDS (a pod bound a moment ago may not have
reached the syncer's Store yet)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from models.names import (
    LABEL_MANAGED_BY,
    LABEL_SUPER_CLUSTER,
    MANAGED_BY,
    TENANT_NODE_TYPE,
    tenant_node_name,
)

# How long a virtual node no pod uses stays before it is deleted.
NODE_UNUSED_GRACE_SECONDS = 60
# What of a physical node's capacity its virtual nodes show.
SHOWN_RESOURCES = ("cpu", "memory", "pods")


def tenant_node(*, super_cluster: str, node: Mapping[str, Any], address: str, kubelet_port: int, heartbeat: str,
                transition: str) -> dict[str, Any]:  # fmt: skip
    """The virtual node standing for physical node `node` (as the super cluster serves it) of `super_cluster`
    in a tenant's control plane: the node's capacity, Ready while the syncer heartbeats it, and the kubelet
    API at `address`:`kubelet_port` (the syncer's, for this tenant)."""
    name = tenant_node_name(super_cluster, node["metadata"]["name"])
    status = node.get("status") or {}
    capacity = {k: v for k, v in (status.get("capacity") or {}).items() if k in SHOWN_RESOURCES}
    allocatable = {k: v for k, v in (status.get("allocatable") or capacity).items() if k in SHOWN_RESOURCES}
    info = status.get("nodeInfo") or {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {
            "type": TENANT_NODE_TYPE, LABEL_SUPER_CLUSTER: super_cluster, LABEL_MANAGED_BY: MANAGED_BY,
            "kubernetes.io/hostname": name, "kubernetes.io/os": info.get("operatingSystem") or "linux"}},
        "spec": {"taints": [{"key": LABEL_SUPER_CLUSTER, "value": super_cluster, "effect": "NoSchedule"}]},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": f"pods run on node {node['metadata']['name']} of super cluster {super_cluster}",
                            "lastHeartbeatTime": heartbeat, "lastTransitionTime": transition}],
            "nodeInfo": {"kubeletVersion": "tidepool", "operatingSystem": info.get("operatingSystem") or "linux",
                         "architecture": info.get("architecture") or "amd64", "machineID": "", "systemUUID": "",
                         "bootID": "", "kernelVersion": info.get("kernelVersion") or "",
                         "osImage": info.get("osImage") or "", "kubeProxyVersion": "",
                         "containerRuntimeVersion": info.get("containerRuntimeVersion") or ""},
            # The name resolves nowhere: no Hostname address, which the API server would try first.
            "addresses": [{"type": "InternalIP", "address": address}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        },
    }  # fmt: skip


def nodes_in_use(*, super_cluster: str, copies: Iterable[Mapping[str, Any]], tenant_pods: Iterable[Mapping[str, Any]],
                 tenant_nodes: Iterable[str]) -> set[str]:  # fmt: skip
    """The tenant's virtual nodes of `super_cluster` that must stay: those of the physical nodes its copies
    there are scheduled on, and those of `tenant_nodes` (its virtual nodes of this super cluster) that a
    tenant pod is bound to (a pod moved to another super cluster keeps its node: nodeName is immutable)."""
    ours = set(tenant_nodes)
    used = {tenant_node_name(super_cluster, node) for copy in copies if (node := (copy.get("spec") or {}).get("nodeName"))}
    used |= {node for pod in tenant_pods if (node := (pod.get("spec") or {}).get("nodeName")) in ours}
    return used


def to_delete(unused_since: Mapping[str, float], *, now: float, grace: float = NODE_UNUSED_GRACE_SECONDS) -> list[str]:
    """The virtual nodes unused for longer than the grace, by the monotonic time each was first seen unused."""
    return sorted(name for name, since in unused_since.items() if now - since >= grace)
