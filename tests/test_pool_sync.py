"""What the pool's syncer copies down besides ConfigMaps and Secrets, what comes back up, and the rules each
super cluster enforces on the tenants' copies (Pod Security, priority classes, the quota's share), on real
clusters of the test's own (tests/pool.py, through tests/test_pool.py's fixture: a tenant control plane, two super clusters, the
scheduler worker and a syncer per super cluster). The test plays the super cluster's cloud controller (a
load balancer's address) and its storage (a volume to bind)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from models.api.supercluster import SYSTEM_PRIORITY_RULE
from models.names import (
    GROUP,
    LABEL_TENANT_NAMESPACE,
    POD_CLUSTER_ANNOTATION,
    SUPER_CLUSTERS,
    VERSION,
    super_cluster_namespace,
)
from models.pool.sync import is_copy
from tests.pool import Pool
from tests.running import eventually
from tests.test_pool import _has_namespace, _placement, _tenant_namespace, pool  # noqa: F401 - the fixture
from workers.syncer import follow_super_cluster

pytestmark = [pytest.mark.env, pytest.mark.pool, pytest.mark.failover]

TARGET = super_cluster_namespace("t1", "app")
SUPER_POD_CIDR, SUPER_POD_IP = "10.250.0.0/24", "10.250.0.7"
SUPER_SERVICE_IP = "10.0.0.1"  # the super cluster's `kubernetes` Service, in its ServiceCIDR (local clusters': 10.0.0.0/24)


def _tenant_objects(api: k8s.ApiClient, *, super_pod_ip: str) -> None:
    """`super_pod_ip`: an address of the super cluster's pods, which the tenant's own endpoints name too (refused)."""
    core, net, disc = k8s.CoreV1Api(api), k8s.NetworkingV1Api(api), k8s.DiscoveryV1Api(api)
    core.create_namespaced_service("app", k8s.V1Service.model_validate({"metadata": {"name": "web"}, "spec": {
        "type": "LoadBalancer", "selector": {"app": "web"}, "ports": [{"port": 80}]}}))  # fmt: skip
    core.create_namespaced_service("app", k8s.V1Service.model_validate({"metadata": {"name": "db"}, "spec": {
        "ports": [{"port": 5432}]}}))  # no selector: its owner writes its endpoints  # fmt: skip
    core.create_namespaced_endpoints("app", k8s.V1Endpoints.model_validate({"metadata": {"name": "db"}, "subsets": [
        {"addresses": [{"ip": "192.0.2.10", "nodeName": "tenant-node"}, {"ip": super_pod_ip},
                       {"ip": SUPER_SERVICE_IP}],
         "ports": [{"port": 5432}]}]}))  # fmt: skip
    disc.create_namespaced_endpoint_slice("app", k8s.V1EndpointSlice.model_validate({
        "metadata": {"name": "db-extra", "labels": {"kubernetes.io/service-name": "db",
                                                    "endpointslice.kubernetes.io/managed-by": "db-operator"}},
        "addressType": "IPv4", "endpoints": [{"addresses": ["192.0.2.11"], "nodeName": "tenant-node"}],
        "ports": [{"port": 5432}]}))  # fmt: skip
    core.create_namespaced_persistent_volume_claim("app", k8s.V1PersistentVolumeClaim.model_validate({
        "metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                                               "resources": {"requests": {"storage": "1Gi"}}}}))  # fmt: skip
    net.create_namespaced_ingress("app", k8s.V1Ingress.model_validate({"metadata": {"name": "web"}, "spec": {
        "defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}}))  # fmt: skip
    net.create_namespaced_network_policy("app", k8s.V1NetworkPolicy.model_validate({"metadata": {"name": "deny"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}))  # fmt: skip
    core.create_namespaced_limit_range("app", k8s.V1LimitRange.model_validate({"metadata": {"name": "limits"},
        "spec": {"limits": [{"type": "Container", "default": {"cpu": "200m"}}]}}))  # fmt: skip


def _copies(cluster: k8s.ApiClient) -> dict[str, set[str]]:
    """The names of tidepool's copies in the super namespace, by kind."""
    core, net, disc = k8s.CoreV1Api(cluster), k8s.NetworkingV1Api(cluster), k8s.DiscoveryV1Api(cluster)
    lists: dict[str, Any] = {
        "Service": core.list_namespaced_service, "Endpoints": core.list_namespaced_endpoints,
        "EndpointSlice": disc.list_namespaced_endpoint_slice, "PersistentVolumeClaim": core.list_namespaced_persistent_volume_claim,
        "Ingress": net.list_namespaced_ingress, "NetworkPolicy": net.list_namespaced_network_policy,
        "LimitRange": core.list_namespaced_limit_range,
    }  # fmt: skip
    return {kind: {o.metadata.name for o in call(TARGET, label_selector=LABEL_TENANT_NAMESPACE).items
                   if is_copy(kind, o.to_dict(serialize=True))} for kind, call in lists.items()}  # fmt: skip


EXPECTED = {"Service": {"web", "db"}, "Endpoints": {"db"}, "EndpointSlice": {"db-extra"},
            "PersistentVolumeClaim": {"data"}, "Ingress": {"web"}, "NetworkPolicy": {"deny"},
            "LimitRange": {"limits"}}  # fmt: skip


async def test_every_kind_goes_down_to_the_placed_cluster_only_and_status_and_events_come_up(pool: Pool) -> None:  # noqa: F811 - the fixture
    api = pool.tenant.api_client()
    core = k8s.CoreV1Api(api)
    for name, cluster in pool.supers.items():  # the super clusters' pod networks, seen by their syncers first
        k8s.CoreV1Api(cluster.api_client()).patch_node(f"{name}-node", {"spec": {"podCIDR": SUPER_POD_CIDR,
                                                                                  "podCIDRs": [SUPER_POD_CIDR]}})  # fmt: skip
    _tenant_namespace(api, "app", cpu="1", memory="2Gi")  # one slice: one cluster
    placement = await eventually(lambda: _placement(api, "app"), timeout=60, what="the placement")
    (placed,) = placement
    (elsewhere,) = set(pool.supers) - {placed}
    down = pool.supers[placed].api_client()
    _tenant_objects(api, super_pod_ip=SUPER_POD_IP)

    # Down: each kind, and only the endpoints the tenant's owner wrote (web's come from the super cluster).
    try:
        await eventually(lambda: _copies(down) == EXPECTED, timeout=60, what="every copy")
    finally:
        assert _copies(down) == EXPECTED  # names what is missing or extra, if the wait timed out
    subsets = k8s.CoreV1Api(down).read_namespaced_endpoints("db", TARGET).subsets or []
    addresses = subsets[0].addresses or []
    assert [a.ip for a in addresses] == ["192.0.2.10"]  # never into the super cluster's pods
    assert addresses[0].node_name is None  # a tenant node means nothing there
    refused = await eventually(lambda: [e for e in core.list_namespaced_event("app", field_selector="involvedObject.name=db")
                                        .items if e.reason == "EndpointRefused"], what="the tenant told")  # fmt: skip
    assert SUPER_POD_IP in refused[0].message and SUPER_SERVICE_IP in refused[0].message
    assert refused[0].type == "Warning"
    assert k8s.CoreV1Api(down).read_namespaced_persistent_volume_claim("data", TARGET).metadata.owner_references is None
    assert not _has_namespace(pool.supers[elsewhere], TARGET)

    # Up: the super cluster's load balancer gives the copy an address; the tenant Service shows it.
    k8s.CoreV1Api(down).patch_namespaced_service_status("web", TARGET, {"status": {"loadBalancer": {
        "ingress": [{"ip": "203.0.113.7"}]}}})  # fmt: skip
    ingress = await eventually(lambda: (core.read_namespaced_service("web", "app").status.load_balancer.ingress),
                               timeout=30, what="the load balancer's address on the tenant Service")  # fmt: skip
    assert [i.ip for i in ingress] == ["203.0.113.7"]

    # Up: a volume binds the claim's copy; the tenant's claim is Bound with its capacity and access modes.
    k8s.CoreV1Api(down).create_persistent_volume(k8s.V1PersistentVolume.model_validate({
        "metadata": {"name": "disk-1"}, "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"],
        "storageClassName": "manual", "hostPath": {"path": "/data/disk-1"},
        "claimRef": {"namespace": TARGET, "name": "data"}}}))  # fmt: skip
    claim = await eventually(lambda: (c := core.read_namespaced_persistent_volume_claim("data", "app")).status.phase
                             == "Bound" and c, timeout=60, what="the tenant claim Bound")  # fmt: skip
    assert claim.status.capacity == {"storage": "2Gi"} and claim.status.access_modes == ["ReadWriteOnce"]
    assert claim.spec.volume_name == f"pool-{placed}-disk-1"

    # Up: an Event about the pod's copy appears on the tenant pod, once, and follows its count.
    core.create_namespaced_pod("app", k8s.V1Pod.model_validate({"metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "nginx",
                                 "resources": {"requests": {"cpu": "100m", "memory": "100Mi"}}}]}}))  # fmt: skip
    pod = await eventually(lambda: (p := core.read_namespaced_pod("web", "app")).metadata.annotations.get(
        POD_CLUSTER_ANNOTATION) and p, timeout=30, what="the pod placed")  # fmt: skip
    assert pod.metadata.annotations[POD_CLUSTER_ANNOTATION] == placed
    copy = await eventually(lambda: k8s.CoreV1Api(down).read_namespaced_pod("web", TARGET), timeout=30,
                            what="the pod's copy")  # fmt: skip
    source = {"metadata": {"name": "web.probe"}, "involvedObject": {"kind": "Pod", "name": "web", "namespace": TARGET,
              "uid": copy.metadata.uid}, "reason": "ProbeWarning", "message": "readiness probe slow", "type": "Warning",
              "count": 1, "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z"}  # fmt: skip
    k8s.CoreV1Api(down).create_namespaced_event(TARGET, k8s.CoreV1Event.model_validate(source))

    def reflected() -> list[Any]:
        return [e for e in core.list_namespaced_event("app", field_selector="involvedObject.name=web").items
                if e.reason == "ProbeWarning"]  # fmt: skip

    events = await eventually(reflected, timeout=30, what="the Event on the tenant pod")
    assert len(events) == 1 and events[0].involved_object.uid == pod.metadata.uid and events[0].count == 1
    k8s.CoreV1Api(down).patch_namespaced_event("web.probe", TARGET, {"count": 2, "lastTimestamp": "2026-01-01T00:01:00Z"})
    events = await eventually(lambda: (r := reflected()) and r[0].count == 2 and r, timeout=30, what="the count")
    assert len(events) == 1


# --- Tenants cannot escape their namespace (models/pool/isolation.py) -------------------------------------
RESTRICTED_CONTAINER = {"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "100m", "memory": "100Mi"}},
                        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"]},
                                            "seccompProfile": {"type": "RuntimeDefault"}}}  # fmt: skip
CLASSES = {"allowed": ["tenant-batch"], "default": "tenant-batch"}
ISO_TARGET = super_cluster_namespace("t1", "iso")


def _hard(cluster: k8s.ApiClient, namespace: str) -> dict[str, str] | None:
    quotas = k8s.CoreV1Api(cluster).list_namespaced_resource_quota(namespace).items
    return dict(quotas[0].spec.hard or {}) if quotas else None


async def test_each_super_cluster_enforces_its_pod_security_priority_classes_and_quota_share(pool: Pool) -> None:  # noqa: F811 - the fixture
    api = pool.tenant.api_client()
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    # The schema refuses a system class for tenants, naming the rule.
    with pytest.raises(ApiException) as refused:
        custom.patch_cluster_custom_object(GROUP, VERSION, SUPER_CLUSTERS, "s1", {"spec": {"priorityClasses": {
            "allowed": ["system-node-critical"]}}})  # fmt: skip
    assert refused.value.status == 422 and SYSTEM_PRIORITY_RULE.split(":")[0] in str(refused.value.body)
    # Each syncer follows its own SuperCluster, as `python -m workers.syncer` does.
    followers = [follow_super_cluster(api, name, syncer).start() for name, syncer in pool.syncers.items()]
    try:
        for name, cluster in pool.supers.items():
            k8s.SchedulingV1Api(cluster.api_client()).create_priority_class(k8s.V1PriorityClass.model_validate(
                {"metadata": {"name": "tenant-batch"}, "value": 1000}))  # fmt: skip
            custom.patch_cluster_custom_object(GROUP, VERSION, SUPER_CLUSTERS, name, {"spec": {
                "podSecurity": "restricted", "priorityClasses": CLASSES}})  # fmt: skip
        for name, syncer in pool.syncers.items():
            await eventually(lambda s=syncer: s.settings.pod_security == "restricted", timeout=30,
                             what=f"the syncer of {name} following its SuperCluster")  # fmt: skip

        # 3 slices over two clusters (2 + 1); pods and Services are counts, kept whole in each.
        core.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": "iso", "annotations": {
            "pool.tidepool.io/slice": '{"cpu": "1", "memory": "2Gi"}'}}}))  # fmt: skip
        core.create_namespaced_resource_quota("iso", k8s.V1ResourceQuota.model_validate({"metadata": {"name": "quota"},
            "spec": {"hard": {"cpu": "3", "memory": "6Gi", "pods": "10"}}}))  # fmt: skip
        placement = await eventually(lambda: _placement(api, "iso"), timeout=60, what="the placement")
        assert sorted(placement.values()) == [1, 2], placement
        for name, slices in placement.items():
            down = pool.supers[name].api_client()
            expected = {"cpu": str(slices), "memory": f"{2 * slices}Gi", "pods": "10"}
            await eventually(lambda d=down, e=expected: _hard(d, ISO_TARGET) == e, timeout=30,
                             what=f"the quota's share on {name}")  # fmt: skip
            labels = k8s.CoreV1Api(down).read_namespace(ISO_TARGET).metadata.labels or {}
            assert labels["pod-security.kubernetes.io/enforce"] == "restricted"

        # A system class is the super cluster's own: the copy gets the default class, and its priority.
        core.create_namespaced_pod("iso", k8s.V1Pod.model_validate({"metadata": {"name": "web"}, "spec": {
            "priorityClassName": "system-node-critical", "containers": [RESTRICTED_CONTAINER]}}))  # fmt: skip
        chosen = await eventually(lambda: (core.read_namespaced_pod("web", "iso").metadata.annotations or {}).get(
            POD_CLUSTER_ANNOTATION), timeout=30, what="the pod's super cluster")  # fmt: skip
        down_core = k8s.CoreV1Api(pool.supers[chosen].api_client())
        copy = await eventually(lambda: down_core.read_namespaced_pod("web", ISO_TARGET), timeout=30, what="the copy")
        assert (copy.spec.priority_class_name, copy.spec.priority) == ("tenant-batch", 1000)

        # A pod that baseline admits and restricted does not (it runs as root): refused, and it says why.
        core.create_namespaced_pod("iso", k8s.V1Pod.model_validate({"metadata": {"name": "root"}, "spec": {
            "containers": [{"name": "root", "image": "nginx",
                            "resources": {"requests": {"cpu": "100m", "memory": "100Mi"}}}]}}))  # fmt: skip
        status = await eventually(lambda: (s := core.read_namespaced_pod("root", "iso").status).reason
                                  == "SuperClusterRefused" and s, timeout=30, what="the refusal")  # fmt: skip
        assert 'PodSecurity "restricted:latest"' in (status.message or "")
    finally:
        for follower in followers:
            follower.stop()
