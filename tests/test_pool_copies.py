"""The one token-stripping rule and the one status-copy rule (models/pods.py) that the virtual kubelet's
copies and the pool syncer's copies share, and what the pool syncer copies down and brings up
(models/pool/sync.py), with the rules that keep tenants apart there (models/pool/isolation.py). Pure: no
cluster."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from models.api.supercluster import SuperClusterSpec
from models.enforcement import POD_SECURITY_PREFIX
from models.names import (
    DRAINING_ANNOTATION,
    LABEL_TENANT_NAMESPACE,
    PLACED_SLICE_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    SCHEDULED_ANNOTATION,
    SOURCE_DIGEST_ANNOTATION,
)
from models.pods import (
    MAX_MESSAGE_CHARS,
    MAX_REASON_CHARS,
    EventBudget,
    ReflectedEvents,
    StatusShape,
    Throttle,
    copied_status,
    dropped_events_event,
    event_for_origin,
    said_by_the_pool,
    status_shape,
    strip_service_account_token,
)
from models.pool.isolation import (
    QuotaShare,
    SuperClusterSettings,
    quota_share,
    slices_held_here,
    tenant_priority_class,
)
from models.pool.moves import refused_status
from models.pool.sync import (
    API_VERSIONS,
    EVERY_HOST,
    SERVICE_NAME_LABEL,
    EndpointGuard,
    copy_for_super,
    endpoints_of,
    hosts_overlap,
    ingress_hosts,
    is_copy,
    load_balancer_status,
    mirror_volume,
    pod_for_super,
    refused_endpoints,
    selectorless_services,
    stale_mirrors,
    status_cluster,
    super_namespace_labels,
    taken_hosts,
    unchanged,
)
from models.resources import Resources
from models.virtual_kubelet import safe_pod_spec

pytestmark = [pytest.mark.pool, pytest.mark.vk]

TOKEN_MOUNT = {"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
SPEC: dict[str, Any] = {
    "serviceAccountName": "builder",
    "containers": [{"name": "main", "image": "busybox", "volumeMounts": [
        {"name": "settings", "mountPath": "/s"}, TOKEN_MOUNT, {"name": "my-token", "mountPath": "/t"}]}],
    "initContainers": [{"name": "init", "image": "busybox", "volumeMounts": [TOKEN_MOUNT]}],
    "volumes": [
        {"name": "settings", "configMap": {"name": "settings"}},
        {"name": "kube-api-access-abcde", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
        # A token the user projected under a name of their own: a credential of the origin all the same.
        {"name": "my-token", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": "vault"}}]}},
    ],
}  # fmt: skip


def _copies() -> list[pytest.ParameterSet]:
    tenant_pod = {"metadata": {"name": "web", "uid": "u1"}, "spec": copy.deepcopy(SPEC)}
    return [
        pytest.param(safe_pod_spec(SPEC), id="the virtual kubelet's copy in the provider"),
        pytest.param(pod_for_super(tenant_pod, tenant="t", target_namespace="t-shop", tenant_namespace="shop")["spec"],
                     id="the syncer's copy in a super cluster"),
    ]  # fmt: skip


@pytest.mark.parametrize("spec", _copies())
def test_no_copy_carries_a_service_account_token_of_the_origin(spec: dict[str, Any]) -> None:
    assert [v["name"] for v in spec["volumes"]] == ["settings"]
    assert [m["name"] for m in spec["containers"][0]["volumeMounts"]] == ["settings"]
    assert spec["initContainers"][0]["volumeMounts"] == []
    assert spec["automountServiceAccountToken"] is False


def test_a_spec_left_without_volumes_has_no_volumes_key_and_the_origin_is_untouched() -> None:
    spec = {"containers": [{"name": "main", "volumeMounts": [TOKEN_MOUNT]}], "volumes": [SPEC["volumes"][1]]}
    stripped = copy.deepcopy(spec)
    strip_service_account_token(stripped)
    assert "volumes" not in stripped
    assert stripped["containers"][0]["volumeMounts"] == []
    assert SPEC["volumes"][1]["name"] == "kube-api-access-abcde"


def test_the_origin_shows_the_copys_running_state_and_never_the_other_clusters_machines() -> None:
    status = {"phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}], "hostIP": "192.168.1.1",
              "hostIPs": [{"ip": "192.168.1.1"}], "qosClass": "BestEffort", "reason": "Evicted",
              "initContainerStatuses": [], "startTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    assert copied_status(status, shape=StatusShape()) == {"phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}],
                                     "reason": "Evicted", "initContainerStatuses": [],
                                     "startTime": "2026-01-01T00:00:00Z", "message": None}  # fmt: skip


# What the pool syncer copies down and brings up (models/pool/sync.py), as vectors.

SERVED = {"uid": "u-1", "resourceVersion": "42", "generation": 3, "creationTimestamp": "2026-01-01T00:00:00Z",
          "managedFields": [{"manager": "kubectl"}], "ownerReferences": [{"kind": "Deployment", "name": "web"}],
          "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "team": "a"}}  # fmt: skip


def _served(kind: str, name: str, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSIONS[kind], "kind": kind, "metadata": {"name": name, "namespace": "shop",
            **copy.deepcopy(SERVED)}, "status": {"phase": "Whatever"}, **fields}  # fmt: skip


def _body(kind: str, obj: dict[str, Any], selectorless: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    return copy_for_super(kind, obj, tenant="t", target_namespace="t-shop", tenant_namespace="shop",
                          selectorless_services=selectorless)  # fmt: skip


@pytest.mark.parametrize("kind,obj,expected", [
    pytest.param("PersistentVolumeClaim", _served("PersistentVolumeClaim", "data", spec={
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "fast",
        "volumeName": "pool-s1-pv-1", "volumeMode": "Filesystem"}),
        {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                  "storageClassName": "fast", "volumeMode": "Filesystem"}},
        id="a claim goes down without the tenant's volume: the super cluster binds its copy to one of its own"),
    pytest.param("Service", _served("Service", "web", spec={
        "selector": {"app": "web"}, "ports": [{"port": 80, "nodePort": 30080}], "type": "LoadBalancer",
        "clusterIP": "10.96.0.9", "clusterIPs": ["10.96.0.9"], "externalIPs": ["203.0.113.7"],
        "loadBalancerIP": "203.0.113.8"}),
        {"spec": {"selector": {"app": "web"}, "ports": [{"port": 80}], "type": "LoadBalancer"}},
        id="a Service goes down without addresses: neither the tenant's nor any it may not claim in a shared cluster"),
    pytest.param("LimitRange", _served("LimitRange", "limits", spec={"limits": [{"type": "Container"}]}),
                 {"spec": {"limits": [{"type": "Container"}]}}, id="a LimitRange goes down whole"),
    pytest.param("Ingress", _served("Ingress", "web", spec={"ingressClassName": "nginx", "rules": []}),
                 {"spec": {"ingressClassName": "nginx", "rules": []}}, id="an Ingress goes down whole, status stays"),
    pytest.param("NetworkPolicy", _served("NetworkPolicy", "deny", spec={"podSelector": {}}),
                 {"spec": {"podSelector": {}}}, id="a NetworkPolicy goes down whole"),
    pytest.param("Endpoints", _served("Endpoints", "db", subsets=[{"addresses": [
        {"ip": "192.0.2.1", "nodeName": "n1", "targetRef": {"kind": "Pod", "name": "x", "uid": "u"}}],
        "notReadyAddresses": [{"ip": "192.0.2.2", "nodeName": "n1"}], "ports": [{"port": 5432}]}]),
        {"subsets": [{"addresses": [{"ip": "192.0.2.1"}], "notReadyAddresses": [{"ip": "192.0.2.2"}],
                      "ports": [{"port": 5432}]}]},
        id="a selector-less Service's Endpoints go down without the tenant's nodes and pods"),
    pytest.param("EndpointSlice", _served("EndpointSlice", "db-1", addressType="IPv4", endpoints=[
        {"addresses": ["192.0.2.1"], "nodeName": "n1", "zone": "z", "targetRef": {"name": "x"}, "conditions": {}}],
        ports=[{"port": 5432}]),
        {"addressType": "IPv4", "endpoints": [{"addresses": ["192.0.2.1"], "conditions": {}}], "ports": [{"port": 5432}]},
        id="a selector-less Service's own EndpointSlice goes down without the tenant's nodes and zones"),
])  # fmt: skip
def test_a_copy_keeps_what_the_workload_needs_and_nothing_the_tenant_allocated(
    kind: str, obj: dict[str, Any], expected: dict[str, Any]
) -> None:
    obj["metadata"]["labels"] = {"kubernetes.io/service-name": "db", "app": "db"}
    body = _body(kind, obj, frozenset({"db"}))
    assert body is not None
    meta = body.pop("metadata")
    assert {k: v for k, v in body.items() if k not in ("apiVersion", "kind")} == expected
    assert set(meta) == {"name", "namespace", "labels", "annotations"}  # no uid, owners, managedFields, version
    assert meta["namespace"] == "t-shop" and meta["labels"][LABEL_TENANT_NAMESPACE] == "shop"
    assert set(meta["annotations"]) == {"team", SOURCE_DIGEST_ANNOTATION}


def test_a_claims_binding_annotations_stay_in_the_tenant() -> None:
    claim = _served("PersistentVolumeClaim", "data", spec={})
    claim["metadata"]["annotations"].update({"pv.kubernetes.io/bind-completed": "yes",
                                             "volume.kubernetes.io/storage-provisioner": "x"})  # fmt: skip
    body = _body("PersistentVolumeClaim", claim)
    assert body is not None and set(body["metadata"]["annotations"]) == {"team", SOURCE_DIGEST_ANNOTATION}


@pytest.mark.parametrize("kind,labels", [
    pytest.param("Endpoints", {}, id="Endpoints of a Service with a selector come from the super cluster"),
    pytest.param("EndpointSlice", {"kubernetes.io/service-name": "web"}, id="so do its EndpointSlices"),
    pytest.param("EndpointSlice", {"kubernetes.io/service-name": "db",
                                   "endpointslice.kubernetes.io/managed-by": "endpointslicemirroring-controller.k8s.io"},
                 id="a slice the tenant mirrored from Endpoints: the super cluster mirrors the copied Endpoints"),
])  # fmt: skip
def test_endpoints_the_super_cluster_derives_itself_are_not_copied(kind: str, labels: dict[str, str]) -> None:
    obj = _served(kind, "web", addressType="IPv4", endpoints=[], subsets=[])
    obj["metadata"]["labels"] = labels
    assert _body(kind, obj, selectorless_services([
        {"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}}}, {"metadata": {"name": "db"}, "spec": {}}])) is None


# A super cluster whose nodes' pods are in 10.244.0.0/16, one node at 192.168.5.10; another tenant's pod at
# 172.30.0.7 (outside the blocks: a CNI of its own); the namespace's own pod copy at 10.244.1.5.
GUARD = EndpointGuard.of(networks=["10.244.0.0/16", "192.168.5.10", "real-node-1"], own=["10.244.1.5"],
                         others=["172.30.0.7", "10.244.2.8"])  # fmt: skip


@pytest.mark.parametrize(("address", "allowed"), [
    pytest.param("203.0.113.9", True, id="a backend outside the super cluster: what selectorless Services are for"),
    pytest.param("10.244.1.5", True, id="a pod of the namespace's own copy"),
    pytest.param("10.244.2.8", False, id="another namespace's pod, in a node's block"),
    pytest.param("172.30.0.7", False, id="another tenant's pod outside any block"),
    pytest.param("192.168.5.10", False, id="a node of the super cluster (its kubelet, its host-network pods)"),
    pytest.param("not-an-ip", False, id="not an address"),
    pytest.param(None, False, id="no address"),
])  # fmt: skip
def test_a_tenants_own_endpoints_reach_outside_or_its_own_pods_and_nothing_else_in_the_super_cluster(
    address: Any, allowed: bool
) -> None:
    assert GUARD.allows(address) is allowed


def test_refused_addresses_are_left_out_of_the_copy_and_named() -> None:
    selectorless = selectorless_services([{"metadata": {"name": "db"}, "spec": {}}])
    endpoints = _served("Endpoints", "db", subsets=[{
        "addresses": [{"ip": "203.0.113.9"}, {"ip": "10.244.2.8"}], "notReadyAddresses": [{"ip": "192.168.5.10"}],
        "ports": [{"port": 5432}]}])  # fmt: skip
    body = copy_for_super("Endpoints", endpoints, tenant="t1", target_namespace="t1-shop", tenant_namespace="shop",
                          selectorless_services=selectorless, endpoints=GUARD)  # fmt: skip
    assert body is not None and body["subsets"] == [{"addresses": [{"ip": "203.0.113.9"}], "notReadyAddresses": [],
                                                     "ports": [{"port": 5432}]}]  # fmt: skip
    assert refused_endpoints("Endpoints", endpoints, GUARD) == ["10.244.2.8", "192.168.5.10"]
    endpoint_slice = _served("EndpointSlice", "db-1", addressType="IPv4", ports=[], endpoints=[
        {"addresses": ["203.0.113.9"]}, {"addresses": ["10.244.1.5"]}, {"addresses": ["172.30.0.7"]}])  # fmt: skip
    endpoint_slice["metadata"]["labels"] = {SERVICE_NAME_LABEL: "db"}
    body = copy_for_super("EndpointSlice", endpoint_slice, tenant="t1", target_namespace="t1-shop",
                          tenant_namespace="shop", selectorless_services=selectorless, endpoints=GUARD)  # fmt: skip
    assert body is not None and body["endpoints"] == [{"addresses": ["203.0.113.9"]}, {"addresses": ["10.244.1.5"]}]
    assert refused_endpoints("EndpointSlice", endpoint_slice, GUARD) == ["172.30.0.7"]


def test_an_unchanged_source_costs_no_write_and_a_changed_one_does() -> None:
    first = _body("LimitRange", _served("LimitRange", "l", spec={"limits": [{"type": "Pod"}]}))
    again = _body("LimitRange", _served("LimitRange", "l", spec={"limits": [{"type": "Pod"}]}))
    changed = _body("LimitRange", _served("LimitRange", "l", spec={"limits": [{"type": "Container"}]}))
    assert first is not None and again is not None and changed is not None
    assert unchanged(first, again) and not unchanged(first, changed) and not unchanged(None, first)


@pytest.mark.parametrize("placement,expected", [
    pytest.param({"s2": 3, "s1": 1}, "s2", id="the cluster with most slices shows status"),
    pytest.param({"s2": 2, "s1": 2}, "s1", id="on a tie the first by name, alike for every syncer"),
    pytest.param({"s1": 0, "s2": 1}, "s2", id="a cluster holding no slice never shows status"),
    pytest.param({}, None, id="an unplaced namespace has no status cluster"),
])  # fmt: skip
def test_one_cluster_per_namespace_shows_status(placement: dict[str, int], expected: str | None) -> None:
    assert status_cluster(placement) == expected


def test_a_load_balancer_shows_the_status_clusters_addresses_and_only_when_they_differ() -> None:
    service = {"spec": {"type": "LoadBalancer"}, "status": {"loadBalancer": {}}}
    copy_ = {"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}}
    assert load_balancer_status(service, copy_) == {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}
    assert load_balancer_status({**service, "status": copy_["status"]}, copy_) is None
    assert load_balancer_status(service | {"status": copy_["status"]}, {"status": {}}) == {"loadBalancer": {"ingress": []}}
    assert load_balancer_status({"spec": {"type": "ClusterIP"}}, copy_) is None


def test_a_claim_bound_in_the_super_cluster_gets_a_volume_pre_bound_to_it_in_the_tenant() -> None:
    claim = {"metadata": {"name": "data", "namespace": "shop", "uid": "c-1"},
             "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"]}}  # fmt: skip
    pending = {"spec": {}, "status": {"phase": "Pending"}}
    bound = {"spec": {"volumeName": "pv-9"}, "status": {"phase": "Bound", "capacity": {"storage": "2Gi"},
                                                       "accessModes": ["ReadWriteOnce"]}}  # fmt: skip
    assert mirror_volume(claim, pending, cluster="s1", tenant_namespace="shop") is None
    volume = mirror_volume(claim, bound, cluster="s1", tenant_namespace="shop")
    assert volume is not None and volume["metadata"]["name"] == "pool-s1-pv-9"
    assert volume["spec"]["claimRef"] == {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "shop",
                                          "name": "data", "uid": "c-1"}  # fmt: skip
    assert volume["spec"]["capacity"] == {"storage": "2Gi"} and volume["spec"]["storageClassName"] == "fast"
    assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert stale_mirrors([volume], [claim]) == []
    assert stale_mirrors([volume], [{"metadata": {"uid": "c-2"}}]) == ["pool-s1-pv-9"]  # the claim was recreated


def test_an_event_on_a_copy_becomes_an_event_on_the_tenant_pod_without_the_super_clusters_machines() -> None:
    event = {"metadata": {"name": "web.1", "uid": "e-1"}, "involvedObject": {"kind": "Pod", "name": "web",
             "uid": "copy-uid", "fieldPath": "spec.containers{web}"}, "reason": "BackOff", "message": "m",
             "type": "Warning", "count": 3, "source": {"component": "kubelet", "host": "super-node-7"},
             "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:05:00Z"}  # fmt: skip
    pod = {"metadata": {"name": "web", "namespace": "shop", "uid": "tenant-uid"}}
    reflected = event_for_origin(event, pod, labels={"l": "s1"})
    assert reflected["metadata"]["name"] == "web.e-1"  # written again, it updates: never a second copy
    assert reflected["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "web",
                                           "uid": "tenant-uid", "fieldPath": "spec.containers{web}"}  # fmt: skip
    assert reflected["source"] == {"component": "kubelet"} and reflected["count"] == 3
    assert reflected["lastTimestamp"] == "2026-01-01T00:05:00Z"


def test_the_super_clusters_scheduling_is_said_to_the_tenant_by_the_pool_not_reflected() -> None:
    scheduled = {"reason": "Scheduled", "type": "Normal", "message": "Successfully assigned s1-x/web to s1-node-0",
                 "source": {"component": "default-scheduler"}}  # fmt: skip
    assert said_by_the_pool(scheduled)
    assert not said_by_the_pool({**scheduled, "reason": "Pulled"})
    assert not said_by_the_pool({**scheduled, "type": "Warning"})  # a warning is news, whatever its reason


def test_each_change_of_a_source_event_is_reflected_once_and_the_memory_is_bounded() -> None:
    memory = ReflectedEvents(capacity=2)
    first = {"metadata": {"uid": "a"}, "count": 1}
    assert memory.is_new(first)
    memory.remember(first)
    assert not memory.is_new(first)  # the watch repeats it, or a relist lists it again
    assert memory.is_new({"metadata": {"uid": "a"}, "count": 2})  # it happened again
    for uid in ("b", "c"):
        memory.remember({"metadata": {"uid": uid}, "count": 1})
    assert len(memory) == 2 and memory.is_new(first)  # forgotten: reflected again by the same name


@pytest.mark.parametrize("kind,obj,expected", [
    pytest.param("Endpoints", {"metadata": {"name": "web"}}, "web", id="Endpoints are their Service's by name"),
    pytest.param("EndpointSlice", {"metadata": {"name": "web-x1", "labels": {SERVICE_NAME_LABEL: "web"}}}, "web",
                 id="a slice is its Service's by label"),
    pytest.param("EndpointSlice", {"metadata": {"name": "orphan"}}, None, id="a slice without the label is nobody's"),
    pytest.param("ConfigMap", {"metadata": {"name": "web"}}, None, id="other kinds hold no endpoints"),
])  # fmt: skip
def test_the_endpoints_of_a_service_are_found_by_name_or_label(kind: str, obj: dict[str, Any], expected: str | None,
                                                               ) -> None:  # fmt: skip
    assert endpoints_of(kind, obj) == expected


@pytest.mark.parametrize("kind,annotations,expected", [
    pytest.param("Endpoints", {}, False, id="Endpoints the super cluster derived, with the Service's labels, are its own"),
    pytest.param("EndpointSlice", {}, False, id="so are its EndpointSlices, derived or mirrored"),
    pytest.param("EndpointSlice", {SOURCE_DIGEST_ANNOTATION: "d"}, True, id="a slice the syncer copied is a copy"),
    pytest.param("EndpointSlice", {SOURCE_DIGEST_ANNOTATION: "d", "mirrored": ""}, False,
                 id="a slice mirrored from a copied Endpoints, annotations and all, is not"),
    pytest.param("ConfigMap", {}, True, id="a labelled ConfigMap is a copy, also one copied before digests"),
])  # fmt: skip
def test_only_the_syncers_own_copies_are_deleted_when_stale(kind: str, annotations: dict[str, str], expected: bool) -> None:
    labels = {LABEL_TENANT_NAMESPACE: "shop"}
    if "mirrored" in annotations:
        labels["endpointslice.kubernetes.io/managed-by"] = "endpointslicemirroring-controller.k8s.io"
    assert is_copy(kind, {"metadata": {"labels": labels, "annotations": annotations}}) is expected


def test_a_reason_the_copy_no_longer_has_is_cleared_on_the_origin() -> None:
    assert copied_status({"phase": "Running"}, shape=StatusShape()) == {"phase": "Running", "reason": None, "message": None}


# What the other cluster reports is bounded (models/pods.py), as vectors.

SHAPE = status_shape({"containers": [{"name": "web"}], "initContainers": [{"name": "init"}],
                      "readinessGates": [{"conditionType": "example.com/ready"}]})  # fmt: skip


@pytest.mark.parametrize(("reported", "shown"), [
    pytest.param({"message": "x" * 100_000, "reason": "R" * 10_000}, {"message": "x" * MAX_MESSAGE_CHARS,
                 "reason": "R" * MAX_REASON_CHARS}, id="a reason and a message are cut to their bounds"),
    pytest.param({"message": {"nested": "x"}}, {"message": None}, id="a message that is no string is cleared"),
    pytest.param({"conditions": [{"type": "Ready", "status": "True", "message": "m" * 5000, "extra": "e"},
                                 {"type": "Ready", "status": "False"},
                                 {"type": "example.com/ready", "status": "True"},
                                 *({"type": f"made-up-{i}", "status": "True"} for i in range(1000))]},
                 {"conditions": [{"type": "Ready", "status": "True", "message": "m" * MAX_MESSAGE_CHARS},
                                 {"type": "example.com/ready", "status": "True"}]},
                 id="conditions of a pod's types and its readiness gates, each once, with a pod condition's fields"),
    pytest.param({"containerStatuses": [{"name": "web", "ready": True, "restartCount": 2, "volumeMounts": [{}] * 99,
                                         "state": {"waiting": {"reason": "BackOff", "message": "w" * 5000, "x": 1}}},
                                        {"name": "web", "ready": False}, {"name": "sidecar", "ready": True}]},
                 {"containerStatuses": [{"name": "web", "ready": True, "restartCount": 2, "state": {
                     "waiting": {"reason": "BackOff", "message": "w" * MAX_MESSAGE_CHARS}}}]},
                 id="container statuses only of the spec's containers, each once, with a kubelet's fields"),
    pytest.param({"initContainerStatuses": [{"name": "web"}, {"name": "init", "state": {"terminated": {
                  "exitCode": 0, "reason": "Completed", "finishedAt": "2026-01-01T00:00:00Z"}}}]},
                 {"initContainerStatuses": [{"name": "init", "state": {"terminated": {
                     "exitCode": 0, "reason": "Completed", "finishedAt": "2026-01-01T00:00:00Z"}}}]},
                 id="init container statuses only of the spec's init containers"),
    pytest.param({"containerStatuses": "not a list"}, {"containerStatuses": []}, id="what is no list shows nothing"),
])  # fmt: skip
def test_what_the_other_cluster_reports_is_shown_within_bounds(reported: dict[str, Any], shown: dict[str, Any]) -> None:
    status = copied_status(reported, shape=SHAPE)
    assert {k: status[k] for k in shown} == shown


def test_an_events_reason_and_message_are_cut_and_its_type_is_one_of_two() -> None:
    event = {"metadata": {"uid": "e"}, "involvedObject": {"fieldPath": "f" * 5000}, "reason": "R" * 1000,
             "message": "m" * 100_000, "type": "Critical", "count": 10**12}  # fmt: skip
    reflected = event_for_origin(event, {"metadata": {"name": "web", "namespace": "shop", "uid": "u"}}, labels={})
    assert (len(reflected["reason"]), len(reflected["message"])) == (MAX_REASON_CHARS, MAX_MESSAGE_CHARS)
    assert reflected["type"] == "Normal" and reflected["count"] == 2**31 - 1
    assert len(reflected["involvedObject"]["fieldPath"]) <= 256


@pytest.mark.parametrize(("arrivals", "written", "dropped"), [
    pytest.param([0.0] * 20, 20, 0, id="a burst of 20 is written whole"),
    pytest.param([0.0] * 100, 20, 80, id="a flood at once: the burst, the rest dropped and counted"),
    pytest.param([i * 6.0 for i in range(100)], 100, 0, id="ten a minute for ten minutes: all written"),
    pytest.param([0.0] * 25 + [60.0] * 25, 30, 20, id="a minute later, ten more are allowed"),
])  # fmt: skip
def test_events_about_one_pod_are_reflected_at_most_ten_a_minute_after_a_burst_of_twenty(
    arrivals: list[float], written: int, dropped: int
) -> None:
    budget: EventBudget[str] = EventBudget()
    assert sum(budget.take("pod", now=t) for t in arrivals) == written
    assert budget.dropped("pod") == dropped


def test_the_dropped_events_are_summarized_at_the_first_drop_then_at_most_once_a_minute() -> None:
    budget: EventBudget[str] = EventBudget(burst=1)
    assert budget.take("pod", now=0) and not budget.summary_due("pod", now=0)  # nothing dropped yet
    assert not budget.take("pod", now=1) and budget.summary_due("pod", now=1)
    assert not budget.take("pod", now=2) and not budget.summary_due("pod", now=2)
    assert budget.summary_due("pod", now=61) and budget.dropped("pod") == 2
    body = dropped_events_event({"metadata": {"name": "web", "namespace": "shop", "uid": "u"}}, dropped=2,
                                source="provider a", labels={}, now="2026-01-01T00:00:00Z")  # fmt: skip
    assert body["metadata"]["name"] == "web.u.dropped" and body["count"] == 2 and "provider a" in body["message"]


def test_the_budgets_of_other_pods_are_their_own_and_memory_is_bounded() -> None:
    budget: EventBudget[str] = EventBudget(burst=1, capacity=2)
    assert budget.take("a", now=0) and not budget.take("a", now=0) and budget.take("b", now=0)
    budget.take("c", now=0)
    assert len(budget) == 2 and budget.dropped("a") == 0  # forgotten, the least recently used first
    budget.forget("b")
    assert len(budget) == 1


def test_a_warning_is_said_once_per_period_or_again_when_what_it_says_changes() -> None:
    throttle: Throttle[str] = Throttle(600, capacity=1)
    assert throttle.due("pod", ("10.96.0.1",), now=0)
    assert not throttle.due("pod", ("10.96.0.1",), now=100)
    assert throttle.due("pod", ("10.96.0.2",), now=101)
    assert throttle.due("pod", ("10.96.0.2",), now=701)
    assert throttle.due("other", (), now=701) and len(throttle) == 1


# Tenants share a super cluster: its rules for their pods (models/pool/sync.py).


def test_a_tenant_namespace_in_a_super_cluster_enforces_pod_security_baseline() -> None:
    labels = super_namespace_labels("t", "shop")
    assert labels[f"{POD_SECURITY_PREFIX}enforce"] == "baseline"
    assert labels[LABEL_TENANT_NAMESPACE] == "shop"


def test_a_tenant_namespace_enforces_the_level_its_super_cluster_sets_in_every_mode() -> None:
    labels = super_namespace_labels("t", "shop", settings=SuperClusterSettings(pod_security="restricted"))
    assert {labels[f"{POD_SECURITY_PREFIX}{mode}"] for mode in ("enforce", "warn", "audit")} == {"restricted"}


def test_super_cluster_settings_default_to_a_super_cluster_that_sets_nothing() -> None:
    spec = SuperClusterSpec.model_validate({"kubeConfigRef": {"name": "s1", "namespace": "tidepool-system"}})
    assert SuperClusterSettings() == SuperClusterSettings.of(spec) == SuperClusterSettings(
        pod_security="baseline", allowed_priority_classes=frozenset(), default_priority_class=None,
        allowed_taints=frozenset())  # fmt: skip


def test_a_tenant_pod_takes_no_priority_of_its_own_to_a_super_cluster() -> None:
    tenant_pod = {"metadata": {"name": "web", "uid": "u1"}, "spec": {
        **copy.deepcopy(SPEC), "priorityClassName": "system-cluster-critical", "priority": 2000000000,
        "preemptionPolicy": "PreemptLowerPriority"}}  # fmt: skip
    spec = pod_for_super(tenant_pod, tenant="t", target_namespace="t-shop", tenant_namespace="shop")["spec"]
    assert not {"priorityClassName", "priority", "preemptionPolicy"} & set(spec)


ALLOWING = SuperClusterSettings(allowed_priority_classes=frozenset({"batch", "web"}), default_priority_class="batch")


@pytest.mark.parametrize(
    ("requested", "settings", "copied"),
    [
        pytest.param("web", ALLOWING, "web", id="an allowed class is kept"),
        pytest.param("system-node-critical", ALLOWING, "batch", id="a system class gets the default"),
        pytest.param("tenant-made", ALLOWING, "batch", id="a class the super cluster does not allow gets the default"),
        pytest.param(None, ALLOWING, "batch", id="no class gets the default"),
        pytest.param("web", SuperClusterSettings(allowed_priority_classes=frozenset({"web"})), "web",
                     id="an allowed class is kept without a default"),
        pytest.param("other", SuperClusterSettings(allowed_priority_classes=frozenset({"web"})), None,
                     id="any other gets none without a default"),
    ],
)  # fmt: skip
def test_a_tenant_pod_keeps_a_priority_class_its_super_cluster_allows_else_gets_the_default(
    requested: str | None, settings: SuperClusterSettings, copied: str | None,
) -> None:  # fmt: skip
    tenant_pod = {"metadata": {"name": "web", "uid": "u1"}, "spec": {
        **copy.deepcopy(SPEC), "priority": 1000, "preemptionPolicy": "PreemptLowerPriority",
        **({"priorityClassName": requested} if requested else {})}}  # fmt: skip
    spec = pod_for_super(tenant_pod, tenant="t", target_namespace="t-shop", tenant_namespace="shop", settings=settings)["spec"]
    assert spec.get("priorityClassName") == copied
    assert not {"priority", "preemptionPolicy"} & set(spec)  # the super cluster's admission resolves them


@given(requested=st.one_of(st.none(), st.sampled_from(["web", "batch", "system-node-critical"]), st.text(max_size=8)),
       allowed=st.frozensets(st.sampled_from(["web", "batch", "gold"])), default=st.sampled_from([None, "web", "gold"]))
def test_a_copy_names_only_an_allowed_class_or_the_default(requested: str | None, allowed: frozenset[str],
                                                           default: str | None) -> None:  # fmt: skip
    settings = SuperClusterSettings(allowed_priority_classes=allowed | ({default} if default else set()),
                                    default_priority_class=default)  # fmt: skip
    copied = tenant_priority_class(requested, settings)
    assert copied == (requested if requested in settings.allowed_priority_classes else default)
    assert copied is None or copied in settings.allowed_priority_classes


def test_a_tenant_pod_keeps_only_the_tolerations_its_super_cluster_allows() -> None:
    """A toleration is a way onto nodes the super cluster's owner keeps apart (its control plane, say): the
    copy keeps those of the keys the SuperCluster allows, and the super cluster's admission adds its own
    not-ready and unreachable defaults."""
    tolerations = [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
                   {"operator": "Exists"},  # every taint
                   {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                   {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 86400}]  # fmt: skip
    tenant_pod = {"metadata": {"name": "web", "uid": "u1"}, "spec": {**copy.deepcopy(SPEC), "tolerations": tolerations}}
    gpus = SuperClusterSettings(allowed_taints=frozenset({"nvidia.com/gpu"}))
    spec = pod_for_super(tenant_pod, tenant="t", target_namespace="t-shop", tenant_namespace="shop", settings=gpus)["spec"]
    assert spec["tolerations"] == [tolerations[2]]
    spec = pod_for_super(tenant_pod, tenant="t", target_namespace="t-shop", tenant_namespace="shop")["spec"]
    assert "tolerations" not in spec


SLICE = {PLACED_SLICE_ANNOTATION: '{"cpu": "2", "memory": "4Gi"}'}


@pytest.mark.parametrize(
    ("annotations", "cluster", "share"),
    [
        pytest.param({**SLICE, PLACEMENTS_ANNOTATION: '{"s1": 2, "s2": 1}'}, "s1", 2, id="the slices placed there"),
        pytest.param({**SLICE, PLACEMENTS_ANNOTATION: '{"s2": 3}', DRAINING_ANNOTATION: '{"s1": 1}'}, "s1", 1,
                     id="slices still draining from there: their pods still run"),
        pytest.param({**SLICE, PLACEMENTS_ANNOTATION: '{"s1": 1}', DRAINING_ANNOTATION: '{"s1": 1}'}, "s1", 2,
                     id="placed and draining add up"),
        pytest.param({**SLICE, PLACEMENTS_ANNOTATION: '{"s2": 3}', SCHEDULED_ANNOTATION: '{"s1": 3}'}, "s1", 3,
                     id="a user's edit waiting for the scheduler keeps what was scheduled there"),
    ],
)  # fmt: skip
def test_a_super_cluster_holds_the_slices_placed_or_draining_there(annotations: dict[str, str], cluster: str,
                                                                  share: int) -> None:  # fmt: skip
    assert slices_held_here(annotations, cluster) == QuotaShare(Resources(cpu="2", memory="4Gi"), share)


def test_a_namespace_whose_slice_cannot_be_read_has_its_quota_copied_whole() -> None:
    assert slices_held_here({PLACED_SLICE_ANNOTATION: "garbage", PLACEMENTS_ANNOTATION: '{"s1": 1}'}, "s1") is None


TWO_SLICES = QuotaShare(Resources(cpu="2", memory="4Gi"), 2)


@pytest.mark.parametrize(
    ("hard", "share", "copied"),
    [
        pytest.param({"cpu": "6", "memory": "12Gi"}, TWO_SLICES, {"cpu": "4", "memory": "8Gi"},
                     id="two of three slices"),
        pytest.param({"requests.cpu": "6", "limits.cpu": "12", "requests.memory": "12Gi"}, TWO_SLICES,
                     {"requests.cpu": "4", "limits.cpu": "4", "requests.memory": "8Gi"},
                     id="requests and limits alike"),
        pytest.param({"cpu": "6", "memory": "12Gi", "pods": "20", "services": "5", "requests.storage": "10Gi"},
                     TWO_SLICES, {"cpu": "4", "memory": "8Gi", "pods": "20", "services": "5",
                                  "requests.storage": "10Gi"}, id="counts and unsliced resources are kept"),
        pytest.param({"cpu": "3", "memory": "6Gi"}, TWO_SLICES, {"cpu": "3", "memory": "6Gi"},
                     id="never more than the tenant's quota (a last slice partly beyond it)"),
        pytest.param({"cpu": "6", "memory": "12Gi"}, QuotaShare(Resources(cpu="2", memory="4Gi"), 0),
                     {"cpu": "0", "memory": "0"}, id="no slice here is no room here"),
    ],
)  # fmt: skip
def test_a_quota_copy_holds_the_share_placed_on_its_super_cluster(hard: dict[str, str], share: QuotaShare,
                                                                  copied: dict[str, str]) -> None:  # fmt: skip
    quota = {"metadata": {"name": "q", "namespace": "shop"}, "spec": {"hard": hard}}
    body = copy_for_super("ResourceQuota", quota, tenant="t", target_namespace="t-shop", tenant_namespace="shop", quota=share)
    assert body is not None and body["spec"] == {"hard": copied}
    assert quota_share(hard, share) == copied


def test_a_quota_copy_changes_its_digest_when_its_share_does() -> None:
    quota = {"metadata": {"name": "q", "namespace": "shop"}, "spec": {"hard": {"cpu": "6", "memory": "12Gi"}}}
    one, two = (copy_for_super("ResourceQuota", quota, tenant="t", target_namespace="t-shop", tenant_namespace="shop",
                               quota=QuotaShare(Resources(cpu="2", memory="4Gi"), n)) for n in (1, 2))  # fmt: skip
    assert one is not None and two is not None and not unchanged(one, two)
    whole = copy_for_super("ResourceQuota", quota, tenant="t", target_namespace="t-shop", tenant_namespace="shop")
    assert whole is not None and whole["spec"]["hard"] == {"cpu": "6", "memory": "12Gi"}


def test_a_pod_its_super_cluster_refuses_is_pending_and_says_why() -> None:
    why = 'pods "web" is forbidden: violates PodSecurity "baseline:latest": privileged'
    status = refused_status(cluster="s1", why=why + " " + "x" * 5000, now="2026-01-01T00:00:00Z")
    assert (status["phase"], status["reason"]) == ("Pending", "SuperClusterRefused")
    assert status["message"].startswith(f"super cluster s1 refuses it: {why}") and len(status["message"]) == 1024
    assert status["conditions"][0]["type"] == "PodScheduled" and status["conditions"][0]["status"] == "False"


def _ingress(*hosts: str | None, tls: tuple[str, ...] = (), default: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"rules": [{"host": h} if h else {} for h in hosts]}
    if tls:
        spec["tls"] = [{"hosts": list(tls)}]
    if default:
        spec["defaultBackend"] = {"service": {"name": "web", "port": {"number": 80}}}
    return {"spec": spec}


def test_an_ingress_claims_its_rules_and_tls_hosts_and_every_host_without_one() -> None:
    assert ingress_hosts(_ingress("Shop.Example.com", tls=("shop.example.com", "api.example.com"))) == {
        "shop.example.com", "api.example.com"}  # fmt: skip
    assert ingress_hosts(_ingress(None)) == {EVERY_HOST}
    assert ingress_hosts(_ingress("a.example.com", default=True)) == {"a.example.com", EVERY_HOST}
    assert ingress_hosts({"spec": {"rules": "garbage", "tls": [None]}}) == frozenset()


@pytest.mark.parametrize(("one", "other", "overlap"), [
    ("shop.example.com", "shop.example.com", True),
    ("*.example.com", "shop.example.com", True),
    ("shop.example.com", "*.example.com", True),
    ("*.example.com", "a.b.example.com", False),  # a wildcard is one label
    ("*.example.com", "example.com", False),
    (EVERY_HOST, EVERY_HOST, True),
    (EVERY_HOST, "shop.example.com", False),  # a catch-all takes what no rule names: named hosts stay theirs
    ("shop.example.com", "web.example.com", False),
])  # fmt: skip
def test_hosts_overlap_when_one_request_could_reach_both(one: str, other: str, overlap: bool) -> None:
    assert hosts_overlap(one, other) is overlap


def test_the_first_tenant_keeps_a_host_and_a_tenant_never_blocks_itself() -> None:
    claims = {"shop.example.com": "t1", "*.apps.example.com": "t1", EVERY_HOST: "t3"}
    assert taken_hosts(frozenset({"shop.example.com", "mine.example.com"}), tenant="t2", claims=claims) == {
        "shop.example.com": "t1"}  # fmt: skip
    assert taken_hosts(frozenset({"x.apps.example.com"}), tenant="t2", claims=claims) == {"x.apps.example.com": "t1"}
    assert taken_hosts(frozenset({EVERY_HOST}), tenant="t2", claims=claims) == {EVERY_HOST: "t3"}
    assert taken_hosts(frozenset({"shop.example.com", "*.apps.example.com"}), tenant="t1", claims=claims) == {}


def test_a_syncer_keeps_a_tenant_pod_whole_only_where_it_runs_or_is_leaving_until_its_copy_is_made() -> None:
    from workers.syncer import PACKED_STATUS, POD_IP, SPEC_LEFT_OUT, _copy_kept, _status, _tenant_pod_kept

    def pod(**annotations: str) -> dict[str, Any]:
        return {"metadata": {"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "7",
                             "annotations": annotations, "managedFields": [{}]},
                "spec": {"nodeName": "s2.node-1", "containers": [{"name": "web", "image": "nginx"}],
                         "initContainers": [{"name": "init", "image": "busybox"}],
                         "readinessGates": [{"conditionType": "example.com/ready"}]},
                "status": {"phase": "Running"}}  # fmt: skip

    def not_copied(_namespace: str, _name: str) -> bool:
        return False

    here = _tenant_pod_kept(pod(**{"pool.tidepool.io/super-cluster": "s1"}), cluster="s1", pooling=True,
                            copied=not_copied)  # fmt: skip
    assert here["spec"]["containers"][0]["image"] == "nginx" and here["status"] == {"phase": "Running"}
    assert "managedFields" not in here["metadata"] and SPEC_LEFT_OUT not in here
    # Once its copy is here, the copy holds the spec: the pod keeps what its copy's status is read by.
    copied = _tenant_pod_kept(pod(**{"pool.tidepool.io/super-cluster": "s1"}), cluster="s1", pooling=True,
                              copied=lambda namespace, name: (namespace, name) == ("shop", "web"))  # fmt: skip
    assert copied["spec"] == {"nodeName": "s2.node-1", "containers": [{"name": "web"}],
                              "initContainers": [{"name": "init"}],
                              "readinessGates": [{"conditionType": "example.com/ready"}]}  # fmt: skip
    assert status_shape(copied["spec"]) == status_shape(pod()["spec"]) and copied[SPEC_LEFT_OUT]
    assert copied["metadata"]["resourceVersion"] == "7" and "status" not in copied and PACKED_STATUS in copied
    assert _status(copied) == {"phase": "Running"} == _status(here)
    # Its copy: whose copy it is, where it runs, its status; none of the tenant's labels (on the tenant's pod).
    copy = _copy_kept({"metadata": {"name": "web", "namespace": "t-shop", "uid": "c1", "resourceVersion": "9",
                                    "labels": {"app": "web", "app.kubernetes.io/managed-by": "tidepool",
                                               "pool.tidepool.io/tenant": "t",
                                               "pool.tidepool.io/tenant-namespace": "shop"},
                                    "annotations": {"example.com/blob": "x" * 1000}},
                       "spec": {"nodeName": "s1-node", "containers": [{"name": "web", "image": "nginx"}]},
                       "status": {"phase": "Running", "podIP": "10.0.0.5"}})  # fmt: skip
    assert copy["metadata"] == {"name": "web", "namespace": "t-shop", "uid": "c1", "resourceVersion": "9",
                                "labels": {"app.kubernetes.io/managed-by": "tidepool", "pool.tidepool.io/tenant": "t",
                                           "pool.tidepool.io/tenant-namespace": "shop"}}  # fmt: skip
    assert copy["spec"] == {"nodeName": "s1-node"} and _status(copy) == {"phase": "Running", "podIP": "10.0.0.5"}
    assert copy[POD_IP] == "10.0.0.5"
    leaving = _tenant_pod_kept(pod(**{"pool.tidepool.io/super-cluster": "s2", "pool.tidepool.io/moved-from": "s1"}),
                               cluster="s1", pooling=True, copied=not_copied)  # fmt: skip
    assert leaving["spec"]["containers"]
    for placed in ({"pool.tidepool.io/super-cluster": "s2"}, {}):
        # A tenant's own annotations (up to 256 KiB a pod) are not held by the clusters it does not run on.
        elsewhere = pod(**placed, **{"example.com/blob": "x" * 100_000})
        kept = _tenant_pod_kept(elsewhere, cluster="s1", pooling=True, copied=not_copied)
        assert kept == {"metadata": {"name": "web", "namespace": "shop", "uid": "u1", "annotations": placed},
                        "spec": {"nodeName": "s2.node-1"}}  # fmt: skip
    assert _tenant_pod_kept(pod(), cluster="s1", pooling=False, copied=not_copied)["spec"]["containers"]  # every pod
