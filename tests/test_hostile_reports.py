"""Attacks on what each side reports to the other (issue 34, items 4, 5 and 6, and the pool's rules), each
made with the attacker's real credentials against the local environment's real API servers:

- the provider is administrator of its own cluster, where the consumer's copies run: it writes a copy's
  status and Events as it likes (its admin kubeconfig here, which is what a provider really holds);
- a consumer's identity in the provider is the kubeconfig the provider wrote for its virtual kubelet (the
  credentials Secret on the consumer);
- a tenant of the pool is a user of the tenant control plane (the tests' administrator of it).

Every attack here succeeded before the defence it tests: the foreign IP reached the consumer pod, every
Event came back, ownership followed a label, and the kubelet API followed a name. One peering serves the
provider and consumer attacks (its setup is most of their cost)."""

from __future__ import annotations

import base64
import ipaddress
import math
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.capacity import HomeCapacity
from kube.clients import client_from_peer_kubeconfig_text
from kube.objects import read_cluster_object
from models.names import (
    ADVERTISEMENTS,
    GROUP,
    LABEL_CONSUMER,
    LABEL_OFFLOADED,
    POD_CLUSTER_ANNOTATION,
    SYSTEM_NAMESPACE,
    TAINT_VIRTUAL_NODE,
    VERSION,
    advertisement_name,
    credentials_secret_name,
    super_cluster_namespace,
)
from models.network import NO_REMAPPING
from models.pods import EVENTS_BURST, EVENTS_PER_MINUTE, MAX_MESSAGE_CHARS
from models.resources import Resources
from models.virtual_kubelet import ORIGIN_UID, remap_ip
from tests.kube import delete_quietly
from tests.offload import Peering, offloaded_namespace, own_clusters, peered, ready_node
from tests.pool import Pool, running_pool
from tests.running import eventually
from workers.peer import request_secret_name

pytestmark = [pytest.mark.env, pytest.mark.hostile, pytest.mark.reflection]

NAMESPACE = "team"
PROVIDER_POD_CIDR = "10.0.0.0/16"  # the provider worker's default; kwok gives its pods 10.0.0.x
TOLERATE = [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}]


@pytest.fixture(scope="module")
async def peering(localenv: EnvState, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Peering]:
    """One peering for the module's attacks, on clusters of its own, its virtual node Ready."""
    with own_clusters(localenv) as (make, suffix):
        async with peered(localenv, make, suffix, consumer_pod_cidr=PROVIDER_POD_CIDR,
                          log_dir=tmp_path_factory.mktemp("vk")) as running:  # fmt: skip
            core = k8s.CoreV1Api(running.consumer.api_client())
            await eventually(lambda: ready_node(core, running.node), timeout=90, what="the virtual node Ready")
            await offloaded_namespace(running, NAMESPACE)
            yield running


async def _offloaded_pod(peering: Peering, name: str) -> tuple[Any, Any]:
    """A consumer pod bound to the virtual node, once its copy runs and it shows the copy's IP."""
    core, remote = k8s.CoreV1Api(peering.consumer.api_client()), k8s.CoreV1Api(peering.provider.api_client())
    core.create_namespaced_pod(NAMESPACE, k8s.V1Pod.model_validate({"metadata": {"name": name}, "spec": {
        "nodeName": peering.node, "tolerations": TOLERATE,
        "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}]}}))  # fmt: skip
    copy = await eventually(lambda: (c := remote.read_namespaced_pod(name,
                                                                     peering.remote(NAMESPACE))).status.pod_ip and c,
                            timeout=60, what=f"the copy of {name} running with an IP")  # fmt: skip
    pod = await eventually(lambda: (p := core.read_namespaced_pod(name, NAMESPACE)).status.pod_ip and p,
                           timeout=30, what=f"{name} showing its copy's IP")  # fmt: skip
    return pod, copy


def _events(peering: Peering, pod: str, reason: str) -> list[k8s.CoreV1Event]:
    core = k8s.CoreV1Api(peering.consumer.api_client())
    return [e for e in core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={pod}").items
            if e.reason == reason]  # fmt: skip


async def test_a_provider_cannot_point_a_consumer_pod_at_an_address_outside_its_podcidr(peering: Peering) -> None:
    """The provider writes the consumer's own API server's address (where its `kubernetes` Service leads) as its
    copy's IP: a consumer Service selecting the pod would send its traffic there."""
    pod, copy = await _offloaded_pod(peering, "ip")
    api_server: Any = k8s.DiscoveryV1Api(peering.consumer.api_client()).read_namespaced_endpoint_slice("kubernetes", "default")
    target = api_server.endpoints[0].addresses[0]
    assert ipaddress.ip_address(target) not in ipaddress.ip_network(PROVIDER_POD_CIDR)
    remote = k8s.CoreV1Api(peering.provider.api_client())
    remote.patch_namespaced_pod_status(copy.metadata.name, peering.remote(NAMESPACE), {"status": {
        "podIP": target, "podIPs": [{"$patch": "replace"}, {"ip": target}]}})  # fmt: skip
    assert remote.read_namespaced_pod(copy.metadata.name, peering.remote(NAMESPACE)).status.pod_ip == target  # the attack
    warnings = await eventually(lambda: _events(peering, "ip", "ProviderReportedForeignIP"), timeout=30,
                                what=f"a Warning naming the foreign address {target}")  # fmt: skip
    assert warnings[0].type == "Warning" and target in warnings[0].message and PROVIDER_POD_CIDR in warnings[0].message
    shown = k8s.CoreV1Api(peering.consumer.api_client()).read_namespaced_pod("ip", NAMESPACE).status
    assert shown.pod_ip != target and target not in [entry.ip for entry in shown.pod_ips or []]
    assert pod.status.pod_ip != target  # what it showed before the attack was its copy's, remapped


KEPT_POD_CIDR = "10.1.0.0/16"  # overlaps none of the consumer's networks: the network module keeps it as it is


@pytest.fixture(scope="module")
async def unremapped(localenv: EnvState, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Peering]:
    """A peering whose PodCIDR the consumer's network module keeps ("None"): the provider's pod IPs are shown
    as they are, inside KEPT_POD_CIDR only."""
    with own_clusters(localenv) as (make, suffix):
        async with peered(localenv, make, suffix, consumer_pod_cidr="10.2.0.0/16", provider_pod_cidr=KEPT_POD_CIDR,
                          log_dir=tmp_path_factory.mktemp("vk")) as running:  # fmt: skip
            core = k8s.CoreV1Api(running.consumer.api_client())
            await eventually(lambda: ready_node(core, running.node), timeout=90, what="the virtual node Ready")
            await offloaded_namespace(running, NAMESPACE)
            yield running


def _decision(peering: Peering) -> tuple[str | None, str | None]:
    """The network module's decision on the provider's Advertisement: (the remapping, the PodCIDR it is for)."""
    status = (read_cluster_object(peering.consumer.api_client(), ADVERTISEMENTS,
                                  advertisement_name(peering.provider_id)) or {}).get("status") or {}  # fmt: skip
    return status.get("remoteRemappedPodCIDR"), status.get("remappedForPodCIDR")


async def test_a_provider_that_moves_its_podcidr_after_acceptance_onto_the_consumers_services_reaches_none(
    unremapped: Peering,
) -> None:
    """Accepted with a harmless PodCIDR, which the network module keeps as it is, the provider (its own identity
    on the consumer, as `tidepool peer` handed it over) moves spec.network.podCIDR onto the consumer's Service
    CIDR and reports the consumer's `kubernetes` Service IP as its copy's: shown as it is, a consumer Service
    selecting the pod would send its traffic to the consumer's API server. The virtual kubelet shows IPs only
    inside the PodCIDR decided for, and the network module, deciding again for the new one, counts the
    consumer's Service CIDR among its networks: remapped, the address leads to the provider."""
    peering, name = unremapped, "moved"
    consumer, provider = peering.consumer.api_client(), peering.provider.api_client()
    core, remote = k8s.CoreV1Api(consumer), k8s.CoreV1Api(provider)
    assert await eventually(lambda: _decision(peering) == (NO_REMAPPING, KEPT_POD_CIDR), what="the PodCIDR kept")
    core.create_namespaced_pod(NAMESPACE, k8s.V1Pod.model_validate({"metadata": {"name": name}, "spec": {
        "nodeName": peering.node, "tolerations": TOLERATE,
        "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}]}}))  # fmt: skip
    copy = await eventually(lambda: remote.read_namespaced_pod(name, peering.remote(NAMESPACE)),
                            timeout=60, what=f"the copy of {name}")  # fmt: skip
    service_cidrs: Any = k8s.NetworkingV1Api(consumer).list_service_cidr()
    kubernetes: Any = core.read_namespaced_service("kubernetes", "default")
    service_cidr, target = str(service_cidrs.items[0].spec.cidrs[0]), str(kubernetes.spec.cluster_ip)
    # Had the virtual kubelet read the spec's PodCIDR beside the old decision, the address would be shown as it is.
    assert remap_ip(target, provider_pod_cidr=service_cidr, remapped_pod_cidr=NO_REMAPPING) == target

    secret: Any = remote.read_namespaced_secret(request_secret_name(peering.consumer_id), SYSTEM_NAMESPACE)
    attacker = client_from_peer_kubeconfig_text(base64.b64decode(secret.data["kubeconfig"]))
    k8s.CustomObjectsApi(attacker).patch_cluster_custom_object(
        GROUP, VERSION, ADVERTISEMENTS, advertisement_name(peering.provider_id),
        {"spec": {"network": {"podCIDR": service_cidr}}})  # fmt: skip
    remote.patch_namespaced_pod_status(copy.metadata.name, peering.remote(NAMESPACE), {"status": {
        "podIP": target, "podIPs": [{"$patch": "replace"}, {"ip": target}]}})  # fmt: skip

    shown: set[str] = set()

    def remapped_and_shown() -> str | None:
        status = core.read_namespaced_pod(name, NAMESPACE).status
        shown.update(ip for ip in [status.pod_ip, *(entry.ip for entry in status.pod_ips or [])] if ip)
        remapped, decided_for = _decision(peering)
        expected = remap_ip(target, provider_pod_cidr=decided_for, remapped_pod_cidr=remapped)
        return status.pod_ip if decided_for == service_cidr and status.pod_ip == expected else None

    ip = await eventually(remapped_and_shown, timeout=30, what=f"{name} showing {target} remapped")
    assert target not in shown, f"{name} showed the consumer's own {target}"
    remapped, _ = _decision(peering)
    assert remapped and remapped != NO_REMAPPING and ipaddress.ip_address(ip) in ipaddress.ip_network(remapped)


async def test_a_provider_flooding_events_on_a_copy_reaches_the_consumer_pod_only_within_its_budget(
    peering: Peering,
) -> None:
    _, copy = await _offloaded_pod(peering, "flood")
    remote = k8s.CoreV1Api(peering.provider.api_client())
    flood = 3 * EVENTS_BURST
    started = time.monotonic()
    for i in range(flood):
        remote.create_namespaced_event(peering.remote(NAMESPACE), k8s.CoreV1Event.model_validate({
            "metadata": {"name": f"flood.{i}"}, "reason": "Flood", "type": "Warning",
            "message": f"{i} " + "x" * 100_000,  # a hundred kilobytes each: bounded too
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": copy.metadata.name,
                               "namespace": peering.remote(NAMESPACE), "uid": copy.metadata.uid},
            "source": {"component": "provider"}, "count": 1}))  # fmt: skip
    summary = await eventually(lambda: _events(peering, "flood", "ReflectedEventsDropped"), timeout=60,
                               what="the Event counting what was dropped")  # fmt: skip
    assert len(summary) == 1 and summary[0].type == "Warning"
    reflected = _events(peering, "flood", "Flood")
    # At most the burst and the refill of the time the flood took (under a minute on an idle machine).
    refill = math.ceil(EVENTS_PER_MINUTE * max(1.0, (time.monotonic() - started) / 60))
    assert 0 < len(reflected) <= EVENTS_BURST + refill and len(reflected) < flood
    assert all(len(e.message or "") <= MAX_MESSAGE_CHARS for e in reflected)


def _consumer_identity_in_provider(peering: Peering) -> k8s.ApiClient:
    """The consumer's real credentials in the provider: the kubeconfig the provider wrote for its virtual kubelet."""
    secret: Any = k8s.CoreV1Api(peering.consumer.api_client()).read_namespaced_secret(
        credentials_secret_name(peering.provider_id), SYSTEM_NAMESPACE)  # fmt: skip
    return client_from_peer_kubeconfig_text(base64.b64decode(secret.data["kubeconfig"]).decode())


async def test_a_consumer_labelling_its_pods_as_another_consumers_changes_no_offer(peering: Peering) -> None:
    """Consumer a writes, with its own credentials in its own foreign namespace, a pod labelled as b's copy:
    by the labels, b's offer would stop subtracting it."""
    other = "cluster-b"
    remote = k8s.CoreV1Api(_consumer_identity_in_provider(peering))
    remote.create_namespaced_pod(peering.control_namespace, k8s.V1Pod.model_validate({
        "metadata": {"name": "spoof", "labels": {LABEL_OFFLOADED: "true", LABEL_CONSUMER: other}},
        "spec": {"containers": [{"name": "main", "image": "busybox",  # placed by the provider's scheduler
                                 "resources": {"requests": {"cpu": "700m"}}}]}}))  # fmt: skip
    admin = k8s.CoreV1Api(peering.provider.api_client())
    spoof: Any = admin.read_namespaced_pod("spoof", peering.control_namespace)
    assert spoof.metadata.labels[LABEL_CONSUMER] == other  # the attack: written with the consumer's credentials
    # The provider's own accounting (kube/capacity.py), as its pushes read it.
    capacity = HomeCapacity(peering.provider.api_client()).start()
    try:
        # The other copies of this module hold 100m each, fewer than seven of them.
        await eventually(lambda: capacity.snapshot(peering.consumer_id).consumer_own.get_or_zero("cpu") >= Decimal("0.7"),
                         timeout=60, what="the pod scheduled and counted as its writer's own")  # fmt: skip
        offer_inputs = capacity.snapshot(other)
        assert offer_inputs.consumer_own == Resources()  # nothing is b's: b's offer subtracts it all
        assert offer_inputs.used.get_or_zero("cpu") >= Decimal("0.7")
    finally:
        capacity.stop()


def _kubectl(peering: Peering, *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(ensure_binaries().kubectl), "--kubeconfig", str(peering.consumer.kubeconfig), "-n", NAMESPACE, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


async def test_exec_and_logs_never_reach_a_pod_the_provider_put_under_a_copys_name(peering: Peering) -> None:
    """The provider deletes a copy and puts a pod of its own under its name: one without the virtual kubelet's
    labels, which it therefore never adopts nor deletes, carrying another consumer pod's uid."""
    other, _ = await _offloaded_pod(peering, "other")
    _, copy = await _offloaded_pod(peering, "victim")
    for args in (("exec", "victim", "--", "true"), ("logs", "victim")):  # the ways in work before the swap
        assert _kubectl(peering, *args).returncode == 0, args
    remote = k8s.CoreV1Api(peering.provider.api_client())
    impostor = k8s.V1Pod.model_validate({
        "metadata": {"name": copy.metadata.name, "annotations": {ORIGIN_UID: other.metadata.uid}},
        "spec": {"nodeName": "big", "containers": [{"name": "main", "image": "busybox"}]}})  # fmt: skip

    def swap() -> bool:
        """Deleted and created at once; the virtual kubelet may recreate its copy in between: then again."""
        delete_quietly(remote.delete_namespaced_pod, copy.metadata.name, peering.remote(NAMESPACE), grace_period_seconds=0)
        try:
            remote.create_namespaced_pod(peering.remote(NAMESPACE), impostor)
        except ApiException as e:
            if e.status != 409:
                raise
        held = remote.read_namespaced_pod(copy.metadata.name, peering.remote(NAMESPACE))
        return not (held.metadata.labels or {}).get(LABEL_CONSUMER)

    await eventually(swap, timeout=30, interval=1, what="the impostor under the copy's name")
    await eventually(lambda: remote.read_namespaced_pod(copy.metadata.name, peering.remote(NAMESPACE)).status.phase
                     == "Running", timeout=30, what="the impostor running under the copy's name")  # fmt: skip
    executed = _kubectl(peering, "exec", "victim", "--", "true")
    assert executed.returncode != 0 and "not this pod's" in executed.stderr, executed.stderr
    logs = _kubectl(peering, "logs", "victim")  # the API server says NotFound in its own words
    assert logs.returncode != 0 and "NotFound" in logs.stderr, logs.stderr
    assert _kubectl(peering, "exec", "other", "--", "true").returncode == 0  # the real copy's pod still answers


# The pool ------------------------------------------------------------------------------------------------


@pytest.fixture
async def pool(localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str) -> AsyncIterator[Pool]:
    async with running_pool(localenv, make_cluster, unique) as running:
        yield running


async def test_a_tenant_cannot_run_a_privileged_pod_nor_take_a_priority_in_a_super_cluster(pool: Pool) -> None:
    api = pool.tenant.api_client()
    core = k8s.CoreV1Api(api)
    core.create_namespace(k8s.V1Namespace.model_validate(
        {"metadata": {"name": "shop", "annotations": {"pool.tidepool.io/slice": '{"cpu": "1", "memory": "2Gi"}'}}}))
    core.create_namespaced_resource_quota("shop", k8s.V1ResourceQuota.model_validate(
        {"metadata": {"name": "quota"}, "spec": {"hard": {"cpu": "1", "memory": "2Gi"}}}))  # fmt: skip
    container: dict[str, Any] = {"name": "main", "image": "busybox",
                                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}  # fmt: skip
    core.create_namespaced_pod("shop", k8s.V1Pod.model_validate({"metadata": {"name": "root"}, "spec": {
        "containers": [{**container, "securityContext": {"privileged": True}}], "hostPID": True}}))  # fmt: skip
    core.create_namespaced_pod("shop", k8s.V1Pod.model_validate({"metadata": {"name": "urgent"}, "spec": {
        "priorityClassName": "system-cluster-critical", "containers": [container]}}))  # fmt: skip
    assert core.read_namespaced_pod("urgent", "shop").spec.priority == 2000000000  # the tenant's admission gave it

    refused: Any = await eventually(lambda: (p := core.read_namespaced_pod("root", "shop")).status.reason
                               == "SuperClusterRefused" and p, timeout=90, what="the privileged pod refused")  # fmt: skip
    assert refused.status.phase == "Pending" and 'PodSecurity "baseline' in refused.status.message
    warnings = [e for e in core.list_namespaced_event("shop", field_selector="involvedObject.name=root").items
                if e.reason == "SuperClusterRefused"]  # fmt: skip
    assert len(warnings) == 1 and "privileged" in (warnings[0].message or "")
    cluster = refused.metadata.annotations[POD_CLUSTER_ANNOTATION]
    assert not [p for p in k8s.CoreV1Api(pool.supers[cluster].api_client()).list_namespaced_pod(super_cluster_namespace("t1", "shop")).items
                if p.metadata.name == "root"]  # fmt: skip

    placed = await eventually(lambda: (core.read_namespaced_pod("urgent", "shop").metadata.annotations or {}).get(
        POD_CLUSTER_ANNOTATION), timeout=60, what="the urgent pod placed")  # fmt: skip
    super_core = k8s.CoreV1Api(pool.supers[placed].api_client())
    copy = await eventually(lambda: super_core.read_namespaced_pod("urgent", super_cluster_namespace("t1", "shop")), timeout=60,
                            what="the urgent pod's copy")  # fmt: skip
    assert copy.spec.priority_class_name is None and not copy.spec.priority
