"""Coherent pod addresses (issue 35): each cluster's kwok nodes hand out pod IPs from blocks of the cluster's own
PodCIDR (`node_pod_cidrs`), a provider whose PodCIDR overlaps the consumer's is shown through the network
module's remapping, so that no two endpoints of a Service share an address; and `kubectl get advertisements`
shows when an Advertisement expires. The pure part first; then a provider and a consumer of the module's own."""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s

from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import node_pod_cidrs
from deploy.localenv.env import EnvState
from kube.objects import read_cluster_object
from models.names import ADVERTISEMENTS, TAINT_VIRTUAL_NODE, advertisement_name
from models.network import NO_REMAPPING
from models.virtual_kubelet import ORIGIN_UID, remap_ip
from tests.kube import create_node
from tests.offload import Peering, offloaded_namespace, own_clusters, peered, ready_node
from tests.running import eventually


@pytest.mark.parametrize(("cluster", "count", "expected"), [
    pytest.param("10.2.0.0/16", 3, ["10.2.0.0/24", "10.2.1.0/24", "10.2.2.0/24"], id="consecutive /24s from the start"),
    pytest.param("10.2.0.0/24", 1, ["10.2.0.0/24"], id="a /24 cluster has one node block"),
    pytest.param("10.2.0.0/16", 0, [], id="no nodes, no blocks"),
])  # fmt: skip
def test_each_node_gets_its_own_block_inside_the_clusters_podcidr(cluster: str, count: int, expected: list[str]) -> None:
    assert node_pod_cidrs(cluster, count) == expected


@pytest.mark.parametrize(("cluster", "count", "message"), [
    pytest.param("10.2.0.0/24", 2, "holds only 1 /24 blocks", id="more nodes than blocks"),
    pytest.param("10.2.0.0/25", 1, "wider than the cluster's PodCIDR", id="a cluster narrower than a node block"),
    pytest.param("10.2.0.1/16", 1, "cluster_pod_cidr '10.2.0.1/16' is not a CIDR", id="host bits set"),
    pytest.param("10.2.0.0/16", -1, "count must be 0 or more", id="a negative count"),
])  # fmt: skip
def test_node_blocks_that_cannot_be_cut_are_refused_naming_the_field(cluster: str, count: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        node_pod_cidrs(cluster, count)


# The provider advertises the consumer's own PodCIDR: its copies' raw addresses are the consumer's pods' own
# (both clusters' first node block is 10.2.0.0/24), so only the remapping keeps the Service's endpoints apart.
POD_CIDR = "10.2.0.0/16"
LOCAL_NODES = ("local-1", "local-2")
REPLICAS = 6  # two per node: the consumer's two and the virtual one
TOLERATE = [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}]


@pytest.fixture(scope="module")
async def peering(localenv: EnvState, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Peering]:
    """One peering for the module, on clusters of its own, its virtual node Ready, the consumer's two nodes
    and the provider's one each with a block of its cluster's PodCIDR."""
    with own_clusters(localenv) as (make, suffix):
        async with peered(localenv, make, suffix, consumer_pod_cidr=POD_CIDR, provider_pod_cidr=POD_CIDR,
                          provider_node_pod_cidr=node_pod_cidrs(POD_CIDR, 1)[0],
                          log_dir=tmp_path_factory.mktemp("vk")) as running:  # fmt: skip
            api = running.consumer.api_client()
            for node, block in zip(LOCAL_NODES, node_pod_cidrs(POD_CIDR, len(LOCAL_NODES)), strict=True):
                create_node(api, node, cpu="8", memory="16Gi", pod_cidr=block)
            await eventually(lambda: ready_node(k8s.CoreV1Api(api), running.node), timeout=90,
                             what="the virtual node Ready")  # fmt: skip
            yield running

def _web() -> dict[str, Any]:
    labels = {"app": "web"}
    return {"metadata": {"name": "web"}, "spec": {
        "replicas": REPLICAS, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
            "containers": [{"name": "web", "image": "nginx", "ports": [{"containerPort": 8080}]}],
            "tolerations": TOLERATE,
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                           "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": labels}}],
        }}}}  # fmt: skip


def _running(core: k8s.CoreV1Api, namespace: str) -> list[Any]:
    pods = core.list_namespaced_pod(namespace, label_selector="app=web").items
    return [p for p in pods if p.status.phase == "Running" and p.status.pod_ip and not p.metadata.deletion_timestamp]


def _ready_addresses(api: k8s.ApiClient, namespace: str, service: str) -> list[str]:
    """Every ready address of the Service's EndpointSlices, repeats kept (a collision must show)."""
    slices = k8s.DiscoveryV1Api(api).list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={service}").items  # fmt: skip
    return sorted(address for s in slices for e in s.endpoints or [] if e.conditions and e.conditions.ready
                  for address in e.addresses)  # fmt: skip


def _inside(ip: str, cidr: str) -> bool:
    return ipaddress.ip_address(ip) in ipaddress.ip_network(cidr)


@pytest.mark.env
@pytest.mark.offloading
async def test_local_and_offloaded_replicas_have_distinct_addresses_of_their_clusters_and_a_service_lists_them(
    peering: Peering,
) -> None:
    api, remote_api = peering.consumer.api_client(), peering.provider.api_client()
    core, remote = k8s.CoreV1Api(api), k8s.CoreV1Api(remote_api)
    remote_namespace = await offloaded_namespace(peering, "shop")
    k8s.AppsV1Api(api).create_namespaced_deployment("shop", k8s.V1Deployment.model_validate(_web()))
    core.create_namespaced_service("shop", k8s.V1Service.model_validate({"metadata": {"name": "web"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}))  # fmt: skip
    pods = await eventually(lambda: len(p := _running(core, "shop")) == REPLICAS and p, timeout=120,
                            what=f"the {REPLICAS} replicas Running with an IP (an offloaded one shows none "
                                 "while its copy's is outside the PodCIDR its provider advertised)")  # fmt: skip

    # The consumer's own replicas: addresses of their node's block, inside the consumer's PodCIDR.
    blocks = dict(zip(LOCAL_NODES, node_pod_cidrs(POD_CIDR, len(LOCAL_NODES)), strict=True))
    local = [p for p in pods if p.spec.node_name in blocks]
    offloaded = [p for p in pods if p.spec.node_name == peering.node]
    assert (len(local), len(offloaded)) == (4, 2), [p.spec.node_name for p in pods]
    for pod in local:
        assert _inside(pod.status.pod_ip, blocks[pod.spec.node_name]), (pod.metadata.name, pod.status.pod_ip)

    # Their copies in the provider: addresses of its node's block, inside the PodCIDR it advertised.
    listed: list[Any] = remote.list_namespaced_pod(remote_namespace, label_selector="app=web").items
    copies = {c.metadata.annotations[ORIGIN_UID]: c for c in listed if c.status.pod_ip}
    copy_ips = [copies[p.metadata.uid].status.pod_ip for p in offloaded]
    assert len(set(copy_ips)) == len(copy_ips), copy_ips
    assert all(_inside(ip, node_pod_cidrs(POD_CIDR, 1)[0]) for ip in copy_ips), copy_ips

    # The PodCIDRs overlap: the consumer shows its offloaded replicas at their copies' addresses, remapped.
    advertisement = read_cluster_object(api, ADVERTISEMENTS, advertisement_name(peering.provider_id)) or {}
    remapped = advertisement["status"]["remoteRemappedPodCIDR"]
    assert remapped != NO_REMAPPING and not ipaddress.ip_network(remapped).overlaps(ipaddress.ip_network(POD_CIDR))
    for pod, copy_ip in zip(offloaded, copy_ips, strict=True):
        assert pod.status.pod_ip == remap_ip(copy_ip, provider_pod_cidr=POD_CIDR, remapped_pod_cidr=remapped)
        assert _inside(pod.status.pod_ip, remapped)

    # No two replicas share an address, and the Service's EndpointSlices list each of them once.
    everyone = sorted(p.status.pod_ip for p in pods)
    assert len(set(everyone)) == REPLICAS, everyone
    await eventually(lambda: _ready_addresses(api, "shop", "web") == everyone, timeout=60,
                     what=f"the Service's EndpointSlices listing {everyone}")  # fmt: skip


@pytest.mark.env
@pytest.mark.offloading
def test_kubectl_get_advertisements_shows_when_each_one_expires(peering: Peering) -> None:
    kubectl = [str(ensure_binaries().kubectl), "--kubeconfig", str(peering.consumer.kubeconfig)]
    listed = subprocess.run([*kubectl, "get", "advertisements"], check=True, capture_output=True, text=True).stdout
    header, *rows = listed.splitlines()
    assert len(rows) == 1, listed  # the provider's only
    # The column's cell by its place under the header: a blank cell (no phase yet) would shift a split().
    expires = rows[0][header.index("EXPIRES"):header.index("AGE")].strip()
    advertisement = read_cluster_object(peering.consumer.api_client(), ADVERTISEMENTS,
                                        advertisement_name(peering.provider_id)) or {}  # fmt: skip
    assert expires == advertisement["spec"]["timeToLive"], listed  # the time itself, not `<invalid>`
    assert datetime.fromisoformat(expires) > datetime.now(UTC), listed
