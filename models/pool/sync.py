"""What the pool's syncer copies down to a super cluster, in what form, and what status comes back up:
pure functions over objects as the API server serves them (dicts). workers/syncer.py reads both sides,
calls these and writes.

Down, every namespaced kind a workload needs (SYNCED_KINDS). A copy is built afresh from the source, so
it never carries what the tenant's API server or controllers allocated: uid, resourceVersion,
managedFields, ownerReferences (owners that exist only in the tenant), status, the tenant's cluster IPs
and node ports, a PVC's volumeName (a volume of the tenant's) and the binding annotations of its PV
controller, the nodeName and targetRef of endpoints (the tenant's nodes and pods). Endpoints and
EndpointSlices go down only for Services without a selector (a Service with one gets its endpoints from
the super cluster's own controllers, from the pods that run there), with only the addresses EndpointGuard
allows: outside the super cluster, or the namespace's own pods.

Up, from one cluster per namespace (status_cluster): a LoadBalancer Service's ingress addresses and a
PVC's binding (through a mirrored PersistentVolume that the tenant's own PV controller binds, so that it
agrees with what the tenant sees). Events about the pods' copies become Events on the tenant pods, once
per change of the source Event (models/pods.py: event_for_origin, ReflectedEvents).

Tenants share a super cluster as consumers share a provider, and get the same rules, at the levels its
SuperCluster sets (models/pool/isolation.py): a tenant's namespace there enforces Pod Security (no
privileged container, host namespace or host path can reach the super cluster's nodes, nor so other
tenants), a tenant pod keeps only a priority class the super cluster allows (TENANT_PRIORITY_FIELDS are
dropped: priority classes are the super cluster's, shared by every tenant, and a tenant that could name
any could preempt the others' pods), and a ResourceQuota's copy holds the share of the quota placed there."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network, ip_address, ip_network
from typing import Any

from models.enforcement import pod_security_labels
from models.names import (
    LABEL_MANAGED_BY,
    LABEL_SUPER_CLUSTER,
    LABEL_TENANT,
    LABEL_TENANT_NAMESPACE,
    MANAGED_BY,
    SOURCE_DIGEST_ANNOTATION,
    TENANT_UID_ANNOTATION,
)
from models.pods import strip_service_account_token
from models.pool.isolation import (
    QuotaShare,
    SuperClusterSettings,
    quota_share,
    tenant_priority_class,
    tenant_tolerations,
)

# What a tenant pod may not say in a super cluster: its priority (a class name, or the number and policy the
# tenant's admission resolved it to). Its copy gets a class the super cluster allows (tenant_priority_class),
# whose priority the super cluster's admission resolves, the same for every tenant.
TENANT_PRIORITY_FIELDS = ("priorityClassName", "priority", "preemptionPolicy")
# Objects a super cluster makes for itself and that must not be copied over its own.
SKIPPED = {"ConfigMap": {"kube-root-ca.crt"}, "ServiceAccount": {"default"}}
# Kind -> apiVersion of every kind copied down, in the order a pass copies them (Services first: the
# Endpoints rule reads them).
API_VERSIONS = {
    "Service": "v1", "ConfigMap": "v1", "Secret": "v1", "ServiceAccount": "v1", "ResourceQuota": "v1",
    "LimitRange": "v1", "PersistentVolumeClaim": "v1", "Endpoints": "v1",
    "EndpointSlice": "discovery.k8s.io/v1", "Ingress": "networking.k8s.io/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
}  # fmt: skip
SYNCED_KINDS = tuple(API_VERSIONS)
# Kinds whose spec a copy takes whole: nothing in it is the tenant's allocation.
WHOLE_SPEC = {"LimitRange", "Ingress", "NetworkPolicy"}
# Annotations the tenant's tools and PV controller write for themselves; the super cluster writes its own.
DROPPED_ANNOTATION_PREFIXES = ("kubectl.kubernetes.io/", "pv.kubernetes.io/", "volume.kubernetes.io/",
                               "volume.beta.kubernetes.io/")  # fmt: skip
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SLICE_MANAGER_LABEL = "endpointslice.kubernetes.io/managed-by"
# Slices the tenant's controllers derive (from a selector, or mirrored from Endpoints): the super
# cluster's own controllers derive theirs from what is copied there.
DERIVED_SLICE_MANAGERS = {"endpointslice-controller.k8s.io", "endpointslicemirroring-controller.k8s.io"}
# A mirrored volume is a name in the tenant for a volume of a super cluster; no tenant node mounts it.
MIRROR_DRIVER = "pool.tidepool.io"


@dataclass(frozen=True)
class EndpointGuard:
    """Where a tenant's own endpoints (a Service without a selector) may send traffic in a super cluster.
    Anywhere outside it (a database on a VM: what such Services are for), and to the pods of the namespace's
    own copy; never into the super cluster's networks otherwise: its nodes' pod CIDRs and addresses, its
    Service CIDRs (the `kubernetes` Service, other tenants' Services), and the other namespaces' pods, which
    are other tenants' (CVE-2021-25740: an endpoint is a route a load balancer or ingress controller follows
    on the tenant's behalf)."""

    networks: tuple[IPv4Network | IPv6Network, ...] = ()
    own: frozenset[str] = frozenset()
    others: frozenset[str] = frozenset()  # the other namespaces' pod IPs: looked up, not scanned as networks

    @classmethod
    def of(cls, *, networks: Iterable[str], own: Iterable[str], others: Iterable[str] = ()) -> EndpointGuard:
        """From the super cluster's pod CIDRs, node addresses (an address is a one-address network) and Service
        CIDRs; whatever does not parse as one is left out."""
        parsed = []
        for network in networks:
            try:
                parsed.append(ip_network(network, strict=False))
            except ValueError:
                continue
        return cls(networks=tuple(parsed), own=frozenset(own), others=frozenset(others))

    def allows(self, address: object) -> bool:
        if not isinstance(address, str):
            return False
        if address in self.own:
            return True
        if address in self.others:
            return False
        try:
            ip = ip_address(address)
        except ValueError:
            return False  # the tenant's API server validated it: not an address the super cluster takes either
        return not any(ip in network for network in self.networks)


def refused_endpoints(kind: str, obj: Mapping[str, Any], guard: EndpointGuard) -> list[str]:
    """The addresses of a tenant's Endpoints or EndpointSlice that `guard` does not allow, sorted."""
    if kind == "Endpoints":
        found = [a.get("ip") for subset in obj.get("subsets") or [] for key in ("addresses", "notReadyAddresses")
                 for a in subset.get(key) or [] if isinstance(a, Mapping)]  # fmt: skip
    elif kind == "EndpointSlice":
        found = [ip for e in obj.get("endpoints") or [] if isinstance(e, Mapping) for ip in e.get("addresses") or []]
    else:
        return []
    return sorted({str(ip) for ip in found if not guard.allows(ip)})


def in_scope(placement: Mapping[str, int], cluster: str, *, pooling: bool, scheduled: Mapping[str, int],
             draining: Mapping[str, int]) -> bool:  # fmt: skip
    """With the SuperClusterPooling gate, a namespace goes only to the clusters of its placement, and
    stays on those the scheduler placed it on (a user's edit or clear of the placement takes nothing away
    before the scheduler has made it a move) and on those it drains from until its move ends
    (models/pool/moves.py); without the gate, everywhere (one super cluster, as in virtualcluster without a
    pool)."""
    if not pooling:
        return True
    return any(counts.get(cluster, 0) > 0 for counts in (placement, scheduled, draining))


def pod_goes_here(pod_cluster: str | None, cluster: str, *, pooling: bool) -> bool:
    """The pods this cluster runs, and whose status it pushes up."""
    return pod_cluster == cluster if pooling else True


def copy_stays_here(moved_from: str | None, cluster: str, *, pooling: bool) -> bool:
    """A pod moved away from this cluster keeps its copy here until the move ends (its replacement
    runs), and this cluster says nothing of it: the new cluster's copy owns the pod's status."""
    return pooling and moved_from == cluster


def copy_for_super(kind: str, obj: dict[str, Any], *, tenant: str, target_namespace: str, tenant_namespace: str,
                   selectorless_services: frozenset[str] = frozenset(),
                   quota: QuotaShare | None = None, endpoints: EndpointGuard | None = None) -> dict[str, Any] | None:  # fmt: skip
    """The object as the super cluster gets it, or None when it is not copied. `selectorless_services`:
    the names of the namespace's Services without a selector, whose endpoints are copied, with only the
    addresses `endpoints` allows (refused_endpoints says which it does not); `quota`: the share of the
    namespace's quota held there (a ResourceQuota's copy holds it), None for the whole."""
    guard = endpoints or EndpointGuard()
    meta = obj.get("metadata") or {}
    if meta.get("name") in SKIPPED.get(kind, set()):
        return None
    if kind == "Secret" and obj.get("type") == "kubernetes.io/service-account-token":
        return None
    labels = meta.get("labels") or {}
    if kind == "Endpoints" and meta.get("name") not in selectorless_services:
        return None
    if kind == "EndpointSlice" and (labels.get(SERVICE_NAME_LABEL) not in selectorless_services
                                    or labels.get(SLICE_MANAGER_LABEL) in DERIVED_SLICE_MANAGERS):  # fmt: skip
        return None
    body: dict[str, Any] = {
        "apiVersion": API_VERSIONS[kind], "kind": kind,
        "metadata": {"name": meta["name"], "namespace": target_namespace,
                     "labels": {**labels, **copy_labels(tenant, tenant_namespace)},
                     "annotations": {k: v for k, v in (meta.get("annotations") or {}).items()
                                     if not k.startswith(DROPPED_ANNOTATION_PREFIXES)}},
    }  # fmt: skip
    spec = copy.deepcopy(obj.get("spec") or {})
    if kind in ("ConfigMap", "Secret"):
        for key in ("data", "binaryData", "stringData", "type", "immutable"):
            if key in obj:
                body[key] = obj[key]
    elif kind == "Service":
        for key in ("clusterIP", "clusterIPs", "healthCheckNodePort", "ipFamilies", "ipFamilyPolicy"):
            spec.pop(key, None)  # the super cluster allocates its own
        for key in ("externalIPs", "loadBalancerIP"):
            spec.pop(key, None)  # addresses a tenant may not claim in a shared cluster (CVE-2020-8554)
        for port in spec.get("ports") or []:
            port.pop("nodePort", None)
        body["spec"] = spec
    elif kind == "ResourceQuota":
        hard = spec.get("hard") or {}
        body["spec"] = {"hard": quota_share(hard, quota) if quota is not None else hard}
    elif kind == "PersistentVolumeClaim":
        spec.pop("volumeName", None)  # the super cluster binds its copy to a volume of its own
        body["spec"] = spec
    elif kind == "Endpoints":
        body["subsets"] = [{key: [_address(a) for a in subset[key] if guard.allows(a.get("ip"))]
                            if key.endswith("ddresses") else subset[key] for key in subset}
                           for subset in obj.get("subsets") or []]  # fmt: skip
    elif kind == "EndpointSlice":
        body["addressType"] = obj["addressType"]
        body["endpoints"] = [{k: v for k, v in e.items() if k not in ("nodeName", "targetRef", "zone", "hints")}
                             for e in obj.get("endpoints") or []
                             if all(guard.allows(ip) for ip in e.get("addresses") or [])]  # fmt: skip
        body["ports"] = obj.get("ports") or []
    elif kind in WHOLE_SPEC:
        body["spec"] = spec
    body["metadata"]["annotations"][SOURCE_DIGEST_ANNOTATION] = _digest(body)
    return body


def _address(address: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in address.items() if k not in ("nodeName", "targetRef")}


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def unchanged(copy_in_super: dict[str, Any] | None, body: dict[str, Any]) -> bool:
    """The copy already holds what `body` would apply: the pass writes nothing."""
    digest = ((copy_in_super or {}).get("metadata", {}).get("annotations") or {}).get(SOURCE_DIGEST_ANNOTATION)
    return digest is not None and digest == body["metadata"]["annotations"][SOURCE_DIGEST_ANNOTATION]


def is_copy(kind: str, obj: dict[str, Any]) -> bool:
    """An object of the super namespace that the syncer owns. The super cluster's endpoint controllers copy
    a Service's labels (ours among them) onto the Endpoints and EndpointSlices they derive, and the mirroring
    controller copies an Endpoints' labels onto its slices: of these kinds, only what carries the source
    digest is a copy (they were never copied without one), and never a slice the mirroring controller manages
    (it copies the Endpoints' annotations too)."""
    if kind not in ("Endpoints", "EndpointSlice"):
        return True
    meta = obj.get("metadata", {})
    derived = (meta.get("labels") or {}).get(SLICE_MANAGER_LABEL) in DERIVED_SLICE_MANAGERS
    return SOURCE_DIGEST_ANNOTATION in (meta.get("annotations") or {}) and not derived


def selectorless_services(services: list[dict[str, Any]]) -> frozenset[str]:
    """Services whose endpoints their owner writes (no selector): those endpoints are copied down."""
    return frozenset(s["metadata"]["name"] for s in services if not (s.get("spec") or {}).get("selector"))


def status_cluster(placement: dict[str, int]) -> str | None:
    """The one cluster of a namespace's placement whose status the tenant sees (a LoadBalancer's addresses,
    a PVC's binding): the one holding most of its slices, and so most of its pods; on a tie, the first by
    name, so that every syncer decides alike without asking the others. One cluster, not a union: two
    syncers writing one status would undo each other's writes, and the tenant would see addresses come
    and go."""
    held = [(-count, name) for name, count in placement.items() if count > 0]
    return min(held)[1] if held else None


def load_balancer_status(service: dict[str, Any], copy_in_super: dict[str, Any]) -> dict[str, Any] | None:
    """The status a tenant LoadBalancer Service should show when it differs from what it shows, else None:
    the ingress addresses the super cluster's load balancer gave its copy (none yet is shown as none)."""
    if (service.get("spec") or {}).get("type") != "LoadBalancer":
        return None
    ingress = ((copy_in_super.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    shown = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return None if ingress == shown else {"loadBalancer": {"ingress": ingress}}


def mirror_volume_name(cluster: str, volume: str) -> str:
    return f"pool-{cluster}-{volume}"


def mirror_volume(claim: dict[str, Any], copy_in_super: dict[str, Any], *, cluster: str,
                  tenant_namespace: str) -> dict[str, Any] | None:  # fmt: skip
    """The PersistentVolume that tells the tenant its claim is bound, once the claim's copy is bound in the
    super cluster, else None. It is pre-bound to the tenant claim (claimRef with its uid), so the tenant's
    own PV controller binds the claim to it and writes the claim's phase, capacity and access modes: a
    status written by the syncer instead would be undone by that controller, which sees an unbound claim.
    Retain: the tenant has nothing to delete; the syncer deletes the mirror when its claim is gone."""
    status, spec = copy_in_super.get("status") or {}, copy_in_super.get("spec") or {}
    if status.get("phase") != "Bound" or not spec.get("volumeName"):
        return None
    meta = claim["metadata"]
    name = mirror_volume_name(cluster, spec["volumeName"])
    return {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_TENANT_NAMESPACE: tenant_namespace,
                                              LABEL_SUPER_CLUSTER: cluster}},
        "spec": {
            "capacity": status.get("capacity") or (claim.get("spec") or {}).get("resources", {}).get("requests", {}),
            "accessModes": status.get("accessModes") or (claim.get("spec") or {}).get("accessModes") or [],
            "volumeMode": (claim.get("spec") or {}).get("volumeMode") or "Filesystem",
            "storageClassName": (claim.get("spec") or {}).get("storageClassName") or "",
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                         "name": meta["name"], "uid": meta["uid"]},
            "csi": {"driver": MIRROR_DRIVER, "volumeHandle": f"{cluster}/{spec['volumeName']}"},
        },
    }  # fmt: skip


def stale_mirrors(mirrors: list[dict[str, Any]], claims: list[dict[str, Any]]) -> list[str]:
    """Mirrored volumes whose tenant claim is gone (or was recreated: another uid): the syncer deletes them."""
    live = {c["metadata"]["uid"] for c in claims}
    return sorted(m["metadata"]["name"] for m in mirrors
                  if ((m.get("spec") or {}).get("claimRef") or {}).get("uid") not in live)  # fmt: skip


def copy_labels(tenant: str, tenant_namespace: str) -> dict[str, str]:
    """What marks everything a syncer makes in a super cluster as made for this tenant's namespace: a
    syncer touches (and deletes) only what carries them. Set last, over any the tenant's object carries."""
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_TENANT: tenant, LABEL_TENANT_NAMESPACE: tenant_namespace}


def super_namespace_labels(tenant: str, tenant_namespace: str, *,
                           settings: SuperClusterSettings = SuperClusterSettings()) -> dict[str, str]:  # fmt: skip
    """The labels of a tenant namespace's copy: whose it is, and the Pod Security its pods must meet."""
    return {**copy_labels(tenant, tenant_namespace), **pod_security_labels(settings.pod_security)}


def pod_for_super(pod: dict[str, Any], *, tenant: str, target_namespace: str, tenant_namespace: str,
                  settings: SuperClusterSettings = SuperClusterSettings()) -> dict[str, Any]:  # fmt: skip
    meta = pod["metadata"]
    spec = copy.deepcopy(pod["spec"])
    requested = spec.get("priorityClassName")
    for key in ("nodeName", *TENANT_PRIORITY_FIELDS):
        spec.pop(key, None)
    if (priority_class := tenant_priority_class(requested, settings)) is not None:
        spec["priorityClassName"] = priority_class
    if tolerations := tenant_tolerations(spec.pop("tolerations", None), settings):
        spec["tolerations"] = tolerations
    strip_service_account_token(spec)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": meta["name"], "namespace": target_namespace,
                     "labels": {**(meta.get("labels") or {}), **copy_labels(tenant, tenant_namespace)},
                     "annotations": {TENANT_UID_ANNOTATION: meta["uid"]}},
        "spec": spec,
    }  # fmt: skip


def endpoints_of(kind: str, obj: dict[str, Any]) -> str | None:
    """The Service whose endpoints an Endpoints or EndpointSlice holds (whether they are copied depends on
    it: selectorless_services), None for any other kind."""
    meta = obj.get("metadata") or {}
    if kind == "Endpoints":
        return str(meta.get("name"))
    if kind == "EndpointSlice":
        return (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
    return None


# An Ingress rule without a host takes every host the controller has no other rule for: that, too, is a claim.
EVERY_HOST = "*"


def ingress_hosts(ingress: Mapping[str, Any]) -> frozenset[str]:
    """The hosts an Ingress claims on a super cluster's ingress controller: its rules' hosts and its TLS hosts,
    lower-cased; EVERY_HOST for a rule without one, or a default backend."""
    spec = ingress.get("spec") or {}
    hosts: set[str] = set()
    rules, tls_entries = spec.get("rules"), spec.get("tls")
    for rule in rules if isinstance(rules, list) else []:
        if isinstance(rule, Mapping):
            hosts.add(str(rule["host"]).lower() if rule.get("host") else EVERY_HOST)
    for tls in tls_entries if isinstance(tls_entries, list) else []:
        named = tls.get("hosts") if isinstance(tls, Mapping) else None
        hosts.update(str(h).lower() for h in (named if isinstance(named, list) else []) if h)
    if spec.get("defaultBackend"):
        hosts.add(EVERY_HOST)
    return frozenset(hosts)


def hosts_overlap(one: str, other: str) -> bool:
    """Whether two Ingress hosts can take the same request: equal, both catch-alls, or a wildcard (`*.x.y`, one
    label) and a host it matches."""
    if one == other:
        return True
    for wildcard, host in ((one, other), (other, one)):
        if wildcard.startswith("*.") and host != EVERY_HOST:
            label, _, rest = host.partition(".")
            if label and label != "*" and rest == wildcard[2:]:
                return True
    return False


def taken_hosts(hosts: frozenset[str], *, tenant: str, claims: Mapping[str, str]) -> dict[str, str]:
    """Of an Ingress's hosts, those another tenant already holds in the super cluster (`claims`: host → the
    tenant whose Ingress copy holds it), each with that tenant: the first copy keeps a host, so that one
    tenant's Ingress never takes another's traffic."""
    return {host: owner for host in sorted(hosts) for claimed, owner in sorted(claims.items())
            if owner != tenant and hosts_overlap(host, claimed)}  # fmt: skip
