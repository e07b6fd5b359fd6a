"""End to end on real clusters: a provider and a consumer of the test's own, each with its real worker,
the consumer's network module and its kubelet stand-in running the real virtual kubelet program."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.metrics import REFLECTED_PODS
from kube.objects import read_cluster_object
from models.names import (
    ADVERTISEMENTS,
    LABEL_OFFLOADED,
    LABEL_PROVIDER,
    SYSTEM_NAMESPACE,
    TAINT_VIRTUAL_NODE,
    advertisement_name,
    virtual_kubelet_name,
)
from tests.kube import apply_cluster_config
from tests.offload import Peering, offloaded_namespace, offloading_entry_of, peered, ready_node
from tests.running import eventually
from tests.scraping import naming_problems, scrape, value

pytestmark = [pytest.mark.env, pytest.mark.vk]


@pytest.fixture
async def peering(localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str,
                  tmp_path: Path) -> AsyncIterator[Peering]:  # fmt: skip
    async with peered(localenv, make_cluster, unique, consumer_pod_cidr="10.2.0.0/16", log_dir=tmp_path) as peering:
        yield peering


def _remote(peering: Peering, kind: str, namespace: str = "app") -> list[str]:
    """The copies in the namespace's remote namespace, under their own names."""
    core = k8s.CoreV1Api(peering.provider.api_client())
    listers: dict[str, Callable[..., k8s.V1PodList | k8s.V1ConfigMapList]] = {
        "pods": core.list_namespaced_pod, "configmaps": core.list_namespaced_config_map}
    listed = listers[kind](peering.remote(namespace), label_selector=f"{LABEL_OFFLOADED}=true").items
    return sorted(o.metadata.name for o in listed if o.metadata.name)


async def test_a_pod_on_the_virtual_node_runs_in_the_provider_and_teardown_leaves_it_clean(peering: Peering) -> None:
    core = k8s.CoreV1Api(peering.consumer.api_client())
    node = await eventually(lambda: ready_node(core, peering.node), timeout=90, what="the virtual node Ready")
    assert node.status.allocatable["cpu"] == "4"  # 50% of the provider's 8 CPU
    assert TAINT_VIRTUAL_NODE in [t.key for t in node.spec.taints]

    await offloaded_namespace(peering, "app")
    core.create_namespaced_config_map("app", k8s.V1ConfigMap.model_validate({"metadata": {"name": "settings"}, "data": {"mode": "offloaded"}}))
    core.create_namespaced_pod("app", k8s.V1Pod.model_validate({
        "metadata": {"name": "job"},
        "spec": {
            "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}},
                            "volumeMounts": [{"name": "settings", "mountPath": "/etc/settings"}]}],
            "volumes": [{"name": "settings", "configMap": {"name": "settings"}}],
            "tolerations": [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}],
            "nodeSelector": {LABEL_PROVIDER: peering.provider_id},
        },
    }))  # fmt: skip
    pod = await eventually(lambda: (p := core.read_namespaced_pod("job", "app")).status.phase == "Running" and p,
                           timeout=60, what="the pod Running in the consumer")  # fmt: skip
    assert pod.spec.node_name == peering.node  # bound by kube-scheduler
    assert pod.status.pod_ip  # the provider's pod IP, brought back
    assert _remote(peering, "pods") == ["job"]
    assert _remote(peering, "configmaps") == ["settings"]

    # A crash of the virtual kubelet: the stand-in restarts it; it adopts what exists.
    pid = await eventually(lambda: peering.runner.pid(virtual_kubelet_name(peering.provider_id)), what="vk pid")
    os.kill(pid, signal.SIGKILL)
    await eventually(lambda: (p := peering.runner.pid(virtual_kubelet_name(peering.provider_id))) and p != pid,
                     timeout=30, what="the virtual kubelet restarted")  # fmt: skip
    core.create_namespaced_pod("app", k8s.V1Pod.model_validate({"metadata": {"name": "second"}, "spec": {
        "containers": [{"name": "main", "image": "busybox"}],
        "tolerations": [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}],
        "nodeSelector": {LABEL_PROVIDER: peering.provider_id}}}))  # fmt: skip
    await eventually(lambda: core.read_namespaced_pod("second", "app").status.phase == "Running", what="second pod")
    assert _remote(peering, "pods") == ["job", "second"]  # exactly one copy of each
    assert _remote(peering, "configmaps") == ["settings"]
    # Its Prometheus endpoint counts them (the stand-in gives each process a port of its own).
    port = await eventually(lambda: peering.runner.metrics_port(virtual_kubelet_name(peering.provider_id)),
                            what="the virtual kubelet's metrics port")  # fmt: skip
    await eventually(lambda: value(scrape(port), REFLECTED_PODS, provider=peering.provider_id) == 2, timeout=30,
                     what="tidepool_reflected_pods = 2")  # fmt: skip
    assert naming_problems(port, service="virtual-kubelet") == []

    # Capacity follows the Advertisement without a restart.
    apply_cluster_config(peering.provider.api_client(), outgoing={"sharingPercentage": 25})
    await eventually(lambda: (core.read_node(peering.node).status.allocatable or {}).get("cpu") == "2", timeout=30,
                     what="the node's capacity to follow")  # fmt: skip

    # A virtual node deleted by hand is registered again at once (its watch says so), not at the next
    # periodic status report minutes later, by when its pods would be garbage-collected as orphans.
    deleted_uid = core.read_node(peering.node).metadata.uid
    core.delete_node(peering.node)
    await eventually(lambda: (n := ready_node(core, peering.node)) and n.metadata.uid != deleted_uid, timeout=20,
                     what="the deleted virtual node registered again")  # fmt: skip

    # Deleting in the consumer deletes in the provider.
    core.delete_namespaced_pod("job", "app")
    await eventually(lambda: _remote(peering, "pods") == ["second"], what="the provider copy gone")
    await eventually(lambda: "job" not in {p.metadata.name for p in core.list_namespaced_pod("app").items},
                     what="the consumer pod gone")  # fmt: skip
    await eventually(lambda: _remote(peering, "configmaps") == [], what="the unused ConfigMap collected")

    # The consumer refuses the provider by policy (deny it, delete its Advertisement). Teardown: node, then
    # virtual kubelet (once the provider is clean), then Advertisement. The provider puts a deleted one back
    # at once, refused this time: the accepted one, known by its uid, is what must go.
    api = peering.consumer.api_client()
    name = advertisement_name(peering.provider_id)
    accepted = read_cluster_object(api, ADVERTISEMENTS, name)
    assert accepted is not None
    accepted_uid = accepted["metadata"]["uid"]
    apply_cluster_config(api, incoming={"deniedClusters": [peering.provider_id]})
    k8s.CustomObjectsApi(api).delete_cluster_custom_object("tidepool.io", "v1alpha1", ADVERTISEMENTS, name)
    await eventually(lambda: (a := read_cluster_object(api, ADVERTISEMENTS, name)) is None or a["metadata"]["uid"] != accepted_uid,
                     timeout=90, what="the accepted Advertisement gone after teardown")  # fmt: skip
    assert _remote(peering, "pods") == [] and _remote(peering, "configmaps") == []
    # Its remote namespace went too (the provider deleted it with its RemoteNamespace), and its entry.
    requests: Any = k8s.CustomObjectsApi(peering.provider.api_client()).list_namespaced_custom_object(
        "tidepool.io", "v1alpha1", peering.control_namespace, "remotenamespaces")  # fmt: skip
    assert requests["items"] == []
    assert offloading_entry_of(api, "app", peering.provider_id) is None
    assert peering.node not in {n.metadata.name for n in core.list_node().items}
    deployments = k8s.AppsV1Api(api).list_namespaced_deployment(SYSTEM_NAMESPACE).items
    assert [d.metadata.name for d in deployments] == []
    # What the provider puts back is refused, and starts nothing.
    await eventually(lambda: ((read_cluster_object(api, ADVERTISEMENTS, name) or {}).get("status") or {}).get("reason") == "Denied",
                     timeout=30, what="the Advertisement put back, refused as Denied")  # fmt: skip
    assert k8s.AppsV1Api(api).list_namespaced_deployment(SYSTEM_NAMESPACE).items == []
