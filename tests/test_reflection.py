"""What an offloaded workload sees (issue 18), end to end on real clusters: a provider and a consumer of
the test's own, each with its real worker, the consumer's network module (whose PodCIDR overlaps the
provider's, so that pod IPs are remapped) and the stand-in running the real virtual kubelet."""

from __future__ import annotations

import base64
import ipaddress
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import LocalCluster, cri_log_line
from deploy.localenv.env import EnvState
from kube.copies import copies_selector
from kube.objects import read_cluster_object
from models.names import (
    ADVERTISEMENTS,
    LABEL_CONSUMER,
    LABEL_PROVIDER,
    TAINT_VIRTUAL_NODE,
    advertisement_name,
)
from models.pods import status_patch
from models.virtual_kubelet import ORIGIN_NAMESPACE, remap_ip
from tests.kube import create_namespace
from tests.offload import Peering, offloaded_namespace, peered, ready_node
from tests.running import eventually

pytestmark = [pytest.mark.env, pytest.mark.vk, pytest.mark.reflection]

PROVIDER_POD_CIDR = "10.0.0.0/16"  # the provider worker's default; kwok gives its pods 10.0.0.x
TOLERATE = [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}]


@pytest.fixture
async def peering(localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str,
                  tmp_path: Path) -> AsyncIterator[Peering]:  # fmt: skip
    # The consumer's own pods are in the provider's PodCIDR too: the provider's is remapped.
    async with peered(localenv, make_cluster, unique, consumer_pod_cidr=PROVIDER_POD_CIDR,
                      consumer_nodes=("local",), log_dir=tmp_path) as peering:  # fmt: skip
        yield peering


def _running(core: k8s.CoreV1Api, namespace: str, selector: str) -> list[k8s.V1Pod]:
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if p.status.phase == "Running" and p.status.pod_ip and not p.metadata.deletion_timestamp]


def _ready_endpoints(api: k8s.ApiClient, namespace: str, service: str) -> set[str]:
    slices = k8s.DiscoveryV1Api(api).list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={service}").items  # fmt: skip
    return {address for s in slices for e in s.endpoints or [] if e.conditions and e.conditions.ready
            for address in e.addresses}  # fmt: skip


def _events(core: k8s.CoreV1Api, namespace: str, pod: str) -> list[k8s.CoreV1Event]:
    return core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}").items


def _web(replicas: int) -> dict[str, Any]:
    """Replicas spread one to one over the consumer's two nodes, its own and the virtual one."""
    labels = {"app": "web"}
    return {
        "metadata": {"name": "web"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {
                "containers": [{"name": "web", "image": "nginx", "ports": [{"containerPort": 8080}],
                                "envFrom": [{"configMapRef": {"name": "settings"}}],
                                "volumeMounts": [{"name": "token", "mountPath": "/var/run/token"}]}],
                "volumes": [{"name": "token", "secret": {"secretName": "token"}}],
                "tolerations": TOLERATE,
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                               "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": labels}}],
            }}},
    }  # fmt: skip


async def test_an_offloaded_workload_gets_its_service_endpoints_live_config_and_events(peering: Peering) -> None:
    api, remote_api = peering.consumer.api_client(), peering.provider.api_client()
    core, remote = k8s.CoreV1Api(api), k8s.CoreV1Api(remote_api)
    await eventually(lambda: ready_node(core, peering.node), timeout=90, what="the virtual node Ready")

    remote_namespace = await offloaded_namespace(peering, "shop")  # its pods' copies run there, under their own names
    assert remote_namespace == peering.remote("shop")
    core.create_namespaced_config_map("shop", k8s.V1ConfigMap.model_validate(
        {"metadata": {"name": "settings"}, "data": {"MODE": "v1"}}))  # fmt: skip
    core.create_namespaced_secret("shop", k8s.V1Secret.model_validate(
        {"metadata": {"name": "token"}, "stringData": {"token": "first"}}))  # fmt: skip
    k8s.AppsV1Api(api).create_namespaced_deployment("shop", k8s.V1Deployment.model_validate(_web(4)))
    core.create_namespaced_service("shop", k8s.V1Service.model_validate({"metadata": {"name": "web"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}))  # fmt: skip

    pods = await eventually(lambda: len(p := _running(core, "shop", "app=web")) == 4 and p, timeout=90,
                            what="the four replicas Running")  # fmt: skip
    offloaded = [p for p in pods if p.spec.node_name == peering.node]
    assert len(offloaded) == 2, [p.spec.node_name for p in pods]
    # The offloaded replicas' IPs are their copies', remapped into the block the network module chose.
    advertisement = read_cluster_object(api, ADVERTISEMENTS, advertisement_name(peering.provider_id)) or {}
    remapped = advertisement["status"]["remoteRemappedPodCIDR"]
    assert remapped != "None"
    listed: Any = remote.list_namespaced_pod(remote_namespace, label_selector="app=web").items
    copies = {f"{c.metadata.annotations[ORIGIN_NAMESPACE]}/{c.metadata.name}": c for c in listed}
    for pod in offloaded:
        copy = copies[f"shop/{pod.metadata.name}"]
        assert pod.status.pod_ip == remap_ip(copy.status.pod_ip, provider_pod_cidr=PROVIDER_POD_CIDR,
                                             remapped_pod_cidr=remapped)  # fmt: skip
        assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(remapped)

    # The consumer's own EndpointSlice controller lists local and offloaded replicas alike.
    everyone = {p.status.pod_ip for p in pods}
    await eventually(lambda: _ready_endpoints(api, "shop", "web") == everyone, timeout=30,
                     what="the consumer Service's EndpointSlices listing all four replicas")  # fmt: skip
    # In the provider, the Service's copy selects the copies of this namespace, and its endpoints are theirs.
    service_copy = await eventually(lambda: remote.read_namespaced_service("web", remote_namespace),
                                    what="the Service's copy")  # fmt: skip
    assert service_copy.spec.selector == {"app": "web", LABEL_CONSUMER: peering.consumer_id, ORIGIN_NAMESPACE: "shop"}
    copy_ips = {c.status.pod_ip for c in copies.values()}
    await eventually(lambda: _ready_endpoints(remote_api, remote_namespace, "web") == copy_ips,
                     timeout=30, what="the copy's EndpointSlices listing the pods' copies")  # fmt: skip

    # An edit of the ConfigMap reaches its copy; so does the Secret's (read again within a minute).
    core.patch_namespaced_config_map("settings", "shop", {"data": {"MODE": "v2"}})
    core.patch_namespaced_secret("token", "shop", {"stringData": {"token": "second"}})
    await eventually(lambda: remote.read_namespaced_config_map("settings", remote_namespace).data == {"MODE": "v2"},
                     timeout=30, what="the ConfigMap's copy edited")  # fmt: skip

    # kubectl on the consumer reaches the copy through the virtual kubelet's kubelet API: logs and exec.
    with open(peering.provider.fake_pods.logs, "a") as log:
        log.write(cri_log_line("served by the provider"))
    logs = _kubectl(peering, "logs", offloaded[0].metadata.name)
    assert logs.returncode == 0 and "served by the provider" in logs.stdout, logs.stderr
    executed = _kubectl(peering, "exec", offloaded[0].metadata.name, "--", "sh", "-c", "echo $TIDEPOOL_FAKE_POD_CLUSTER")
    assert (executed.returncode, executed.stdout) == (0, f"{peering.provider.name}\n"), executed.stderr

    # A copy deleted in the provider behind our back: a Deployment's pod runs again (a new copy), ...
    lost = offloaded[0]
    lost_copy: Any = copies[f"shop/{lost.metadata.name}"]
    remote.delete_namespaced_pod(lost_copy.metadata.name, remote_namespace, grace_period_seconds=0)
    await eventually(lambda: (c := remote.read_namespaced_pod(lost_copy.metadata.name, remote_namespace))
                     .metadata.uid != lost_copy.metadata.uid and c.status.phase == "Running", timeout=60,
                     what="the lost copy made again")  # fmt: skip
    # The consumer's pod shows the new copy's status as the virtual kubelet reflects it: Pending, then Running.
    await eventually(lambda: core.read_namespaced_pod(lost.metadata.name, "shop").status.phase == "Running",
                     timeout=30, what="the pod Running again on its new copy")  # fmt: skip
    # ... one that never restarts fails, and says why.
    core.create_namespaced_pod("shop", k8s.V1Pod.model_validate({"metadata": {"name": "once"}, "spec": {
        "restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}], "tolerations": TOLERATE,
        "nodeSelector": {LABEL_PROVIDER: peering.provider_id}}}))  # fmt: skip
    await eventually(lambda: core.read_namespaced_pod("once", "shop").status.phase == "Running", timeout=60,
                     what="the Never pod Running")  # fmt: skip
    remote.delete_namespaced_pod("once", remote_namespace, grace_period_seconds=0)
    failed = await eventually(lambda: (p := core.read_namespaced_pod("once", "shop")).status.phase == "Failed" and p,
                              timeout=60, what="the Never pod Failed")  # fmt: skip
    assert failed.status.reason == "ProviderPodDeleted"

    # A copy the provider cannot schedule: the consumer's pod says why, in its Events.
    remote.patch_node("big", {"spec": {"unschedulable": True}})
    core.create_namespaced_pod("shop", k8s.V1Pod.model_validate({"metadata": {"name": "stuck"}, "spec": {
        "containers": [{"name": "main", "image": "busybox"}], "tolerations": TOLERATE,
        "nodeSelector": {LABEL_PROVIDER: peering.provider_id}}}))  # fmt: skip
    failure = await eventually(lambda: next((e for e in _events(core, "shop", "stuck") if e.reason == "FailedScheduling"),
                                            None), timeout=60, what="the provider's FailedScheduling on the pod")  # fmt: skip
    assert failure.type == "Warning" and "unschedulable" in failure.message, failure.message
    assert failure.involved_object.uid == core.read_namespaced_pod("stuck", "shop").metadata.uid
    remote.patch_node("big", {"spec": {"unschedulable": False}})

    # A Service tidepool did not make in the provider is never overwritten; deleting one that it made
    # deletes the copy.
    remote.create_namespaced_service(remote_namespace, k8s.V1Service.model_validate({
        "metadata": {"name": "theirs"}, "spec": {"selector": {"owner": "provider"}, "ports": [{"port": 81}]}}))  # fmt: skip
    core.create_namespaced_service("shop", k8s.V1Service.model_validate({"metadata": {"name": "theirs"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"port": 80}]}}))  # fmt: skip
    core.delete_namespaced_service("web", "shop")
    await eventually(lambda: "web" not in {s.metadata.name for s in remote.list_namespaced_service(
        remote_namespace).items}, timeout=30, what="the deleted Service's copy gone")  # fmt: skip
    assert remote.read_namespaced_service("theirs", remote_namespace).spec.selector == {"owner": "provider"}

    await eventually(lambda: _secret_copy(remote, remote_namespace) == "second", timeout=90,
                     what="the Secret's copy edited")  # fmt: skip
    # Nothing of the consumer's was copied twice: one copy per replica, per used ConfigMap and Secret, in the
    # remote namespace and nowhere else in the provider.
    mine = f"{LABEL_CONSUMER}={peering.consumer_id}"
    assert sorted(str(c.metadata.name) for c in remote.list_namespaced_config_map(
        remote_namespace, label_selector=mine).items) == ["settings"]  # fmt: skip
    assert sorted(str(c.metadata.name) for c in remote.list_namespaced_secret(
        remote_namespace, label_selector=mine).items) == ["token"]  # fmt: skip
    everywhere = copies_selector(peering.consumer_id)
    assert sorted((str(c.metadata.namespace), str(c.metadata.name)) for c in remote.list_config_map_for_all_namespaces(
        label_selector=everywhere).items) == [(remote_namespace, "settings")]  # fmt: skip
    assert sorted((str(c.metadata.namespace), str(c.metadata.name)) for c in remote.list_secret_for_all_namespaces(
        label_selector=everywhere).items) == [(remote_namespace, "token")]  # fmt: skip


def _kubectl(peering: Peering, *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(ensure_binaries().kubectl), "--kubeconfig", str(peering.consumer.kubeconfig), "-n", "shop", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def _secret_copy(remote: k8s.CoreV1Api, namespace: str) -> str:
    data = remote.read_namespaced_secret("token", namespace).data or {}
    return base64.b64decode(data.get("token", "")).decode()


def test_a_new_copys_pod_ips_replace_the_old_ones_on_the_origin_pod(clusters: Any, unique: str) -> None:
    """A lost copy's replacement has another IP: a strategic merge would add it to the old one (merged by
    `ip`), which the API server refuses, and the pod would keep the IP of a copy that is gone."""
    core = k8s.CoreV1Api(clusters.a.api_client())
    namespace = f"ips-{unique}"
    create_namespace(core.api_client, namespace)
    core.create_namespaced_pod(namespace, k8s.V1Pod.model_validate({  # bound to no node: nothing else writes its status
        "metadata": {"name": "p"}, "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "x"}]}}))
    for ip in ("10.0.0.1", "10.0.0.2"):
        core.patch_namespaced_pod_status("p", namespace, status_patch({"podIP": ip, "podIPs": [{"ip": ip}]}))
    status = core.read_namespaced_pod_status("p", namespace).status
    assert (status.pod_ip, [entry.ip for entry in status.pod_ips]) == ("10.0.0.2", ["10.0.0.2"])
