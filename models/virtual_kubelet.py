"""The virtual kubelet's pure parts. `virtual_kubelet_deployment` is the Deployment the consumer side
creates for an accepted Advertisement (the contract between workflows/advertisement.py and
workers/virtual_kubelet)."""

from __future__ import annotations

import copy
import hashlib
import ipaddress
import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Literal, NamedTuple, get_args

from models.api.offloading import RemoteNamespacePhase
from models.enforcement import SERVICE_ACCOUNT_TOKEN_TYPE
from models.names import (
    API_VERSION,
    LABEL_CONSUMER,
    LABEL_MANAGED_BY,
    LABEL_NODE_TYPE,
    LABEL_OFFLOADED,
    LABEL_PROVIDER,
    MANAGED_BY,
    SYSTEM_NAMESPACE,
    TAINT_VIRTUAL_NODE,
    VIRTUAL_NODE_TYPE,
    virtual_kubelet_name,
    virtual_node_name,
)
from models.network import NO_REMAPPING
from models.pods import StatusShape, clipped, copied_status, is_service_account_token, strip_service_account_token
from models.settings import VIRTUAL_KUBELET_ENV_PREFIX, VirtualKubeletSettings

PROVIDER_KUBECONFIG_DIR = "/etc/tidepool/provider"


def virtual_kubelet_deployment(
    *, provider_id: str, consumer_id: str, advertisement: str, kubeconfig_secret: str,
    namespace: str = SYSTEM_NAMESPACE, settings: VirtualKubeletSettings = VirtualKubeletSettings(),
) -> dict[str, Any]:  # fmt: skip
    name = virtual_kubelet_name(provider_id)
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_PROVIDER: provider_id}
    # The fields of VirtualKubeletProcessSettings, which the virtual kubelet reads back from its environment.
    process: dict[str, object] = {
        "provider_id": provider_id, "consumer_id": consumer_id, "advertisement": advertisement,
        "namespace": namespace, "provider_kubeconfig": f"{PROVIDER_KUBECONFIG_DIR}/kubeconfig",
        "metrics_port": settings.metrics_port, "kubelet_port": settings.kubelet_port,
        "pod_workers": settings.pod_workers, "config_workers": settings.config_workers,
        "service_workers": settings.service_workers, "event_workers": settings.event_workers,
        "namespace_workers": settings.namespace_workers, "keepalive_renew_seconds": settings.keepalive_renew_seconds,
    }  # fmt: skip
    env = {f"{VIRTUAL_KUBELET_ENV_PREFIX}{field.upper()}": str(value) for field, value in process.items()}
    ports = [{"name": "kubelet", "containerPort": settings.kubelet_port}]
    if settings.metrics_port:
        ports.append({"name": "metrics", "containerPort": settings.metrics_port})
    # The node's InternalIP is the pod's: the API server dials it for logs and exec.
    node_ip = {"name": f"{VIRTUAL_KUBELET_ENV_PREFIX}NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # never two virtual kubelets for one provider
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": "tidepool-virtual-kubelet",
                    **settings.placement(),
                    # Pod Security "restricted", which deploy/base enforces on the namespace, as the worker's pod.
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "virtual-kubelet", "image": settings.image,
                        "command": ["python", "-m", "workers.virtual_kubelet"],
                        "env": [*({"name": k, "value": v} for k, v in env.items()), node_ip],
                        "ports": ports,
                        # Up once it serves the kubelet API, which it does from its start (the node follows).
                        "readinessProbe": {"tcpSocket": {"port": "kubelet"}},
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "provider-kubeconfig", "mountPath": PROVIDER_KUBECONFIG_DIR,
                                          "readOnly": True},
                                         # The kubelet API's certificate is loaded from a private temporary file.
                                         {"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "provider-kubeconfig", "secret": {"secretName": kubeconfig_secret}},
                                {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# Reflection: a consumer pod made safe to run in the provider's namespace, and names that cannot collide.

ORIGIN_NAMESPACE = "tidepool.io/origin-namespace"  # an annotation, and a label on pod copies (Services select it)
ORIGIN_NAME = "tidepool.io/origin-name"
ORIGIN_UID = "tidepool.io/origin-uid"
# On a ConfigMap's or Secret's copy: the source's resourceVersion it was made from (an edit changes it).
ORIGIN_VERSION = "tidepool.io/origin-resource-version"
# On a Service's copy: a digest of what it was made from, compared instead of the copy's defaulted spec.
SOURCE_DIGEST = "tidepool.io/source-digest"
# On a pod that never restarts, once its copy is made: a copy lost after that fails the pod.
REFLECTED_ANNOTATION = "tidepool.io/reflected"
MAX_NAME = 63


def reflected_name(namespace: str, name: str) -> str:
    """The single-namespace layout's name (`<namespace>-<name>`, shortened with a hash of the whole when too
    long): every consumer namespace shared one provider namespace, the control namespace. Copies are made
    under their own names in their namespace's remote namespace now; this names the copies an earlier
    release made there, which the virtual kubelet adopts until they move (or their pods go)."""
    full = f"{namespace}-{name}"
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    return f"{full[: MAX_NAME - 11].rstrip('-.')}-{digest}"


def _copy_name(namespace: str, name: str, *, legacy: bool) -> str:
    return reflected_name(namespace, name) if legacy else name


def referenced_objects(pod_spec: dict[str, Any]) -> tuple[set[str], set[str]]:
    """Names of the ConfigMaps and Secrets a pod spec uses (volumes, env, envFrom, projected)."""
    config_maps: set[str] = set()
    secrets: set[str] = set()
    for volume in pod_spec.get("volumes") or []:
        if is_service_account_token(volume):
            continue  # dropped from the provider's copy, with the kube-root-ca.crt it projects
        if (volume.get("configMap") or {}).get("name"):
            config_maps.add(volume["configMap"]["name"])
        if (volume.get("secret") or {}).get("secretName"):
            secrets.add(volume["secret"]["secretName"])
        for source in (volume.get("projected") or {}).get("sources") or []:
            if (source.get("configMap") or {}).get("name"):
                config_maps.add(source["configMap"]["name"])
            if (source.get("secret") or {}).get("name"):
                secrets.add(source["secret"]["name"])
    for container in [*(pod_spec.get("containers") or []), *(pod_spec.get("initContainers") or [])]:
        for env in container.get("env") or []:
            ref = env.get("valueFrom") or {}
            if (ref.get("configMapKeyRef") or {}).get("name"):
                config_maps.add(ref["configMapKeyRef"]["name"])
            if (ref.get("secretKeyRef") or {}).get("name"):
                secrets.add(ref["secretKeyRef"]["name"])
        for source in container.get("envFrom") or []:
            if (source.get("configMapRef") or {}).get("name"):
                config_maps.add(source["configMapRef"]["name"])
            if (source.get("secretRef") or {}).get("name"):
                secrets.add(source["secretRef"]["name"])
    return config_maps, secrets


def copy_labels(*, consumer_id: str, namespace: str, labels: Mapping[str, str] | None = None) -> dict[str, str]:
    """What marks a copy as this consumer's (the virtual kubelet lists and deletes by it, and never touches
    an object without it); on pods, with the origin's labels and namespace, which Services' copies select."""
    return {**(labels or {}), LABEL_OFFLOADED: "true", LABEL_CONSUMER: consumer_id, ORIGIN_NAMESPACE: namespace}


def pod_copy(pod: dict[str, Any], *, consumer_id: str, legacy: bool = False) -> dict[str, Any]:
    """A pod's copy, under its own name in its namespace's remote namespace (`legacy`: the single-namespace
    layout's, which only tests still make, as an earlier release did)."""
    meta = pod["metadata"]
    namespace = meta["namespace"]
    return {
        "metadata": {
            "name": _copy_name(namespace, meta["name"], legacy=legacy),
            "labels": copy_labels(consumer_id=consumer_id, namespace=namespace, labels=meta.get("labels")),
            "annotations": {ORIGIN_NAMESPACE: namespace, ORIGIN_NAME: meta["name"], ORIGIN_UID: meta["uid"]},
        },
        "spec": safe_pod_spec(pod["spec"], legacy_namespace=namespace if legacy else None),
    }


def config_copy(source: dict[str, Any], *, kind: Literal["ConfigMap", "Secret"], consumer_id: str,
                legacy: bool = False) -> dict[str, Any]:  # fmt: skip
    """A ConfigMap's or Secret's copy under its own name, marked with the version of the source it was made from."""
    meta = source["metadata"]
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": kind,
        "metadata": {"name": _copy_name(meta["namespace"], meta["name"], legacy=legacy),
                     "labels": copy_labels(consumer_id=consumer_id, namespace=meta["namespace"]),
                     "annotations": {ORIGIN_NAMESPACE: meta["namespace"], ORIGIN_NAME: meta["name"],
                                     ORIGIN_VERSION: meta["resourceVersion"]}},
        "data": source.get("data") or {},
    }  # fmt: skip
    if kind == "Secret":
        # A service-account token's copy is data (Opaque): of that type the provider's token controller would
        # own it, and the provider refuses the type on a consumer's Secret (models.enforcement).
        kept = source.get("type") or "Opaque"
        body["type"] = "Opaque" if kept == SERVICE_ACCOUNT_TOKEN_TYPE else kept
    elif source.get("binaryData"):
        body["binaryData"] = source["binaryData"]
    return body


def service_copy(service: dict[str, Any], *, consumer_id: str, legacy: bool = False) -> dict[str, Any] | None:
    """The Service the provider gets for a consumer Service, or None when it is not reflected: one without a
    selector (its endpoints are someone's hand-made list, of the consumer's addresses) or an ExternalName.
    The copy selects the pods' copies from the same consumer namespace, and the provider allocates its own
    address: a ClusterIP Service (headless stays headless); NodePorts and load balancers stay the consumer's."""
    meta, spec = service["metadata"], service.get("spec") or {}
    if not spec.get("selector") or spec.get("type") == "ExternalName":
        return None
    namespace = meta["namespace"]
    copied: dict[str, Any] = {
        "type": "ClusterIP",
        "selector": {**spec["selector"], LABEL_CONSUMER: consumer_id, ORIGIN_NAMESPACE: namespace},
        "ports": [{k: v for k, v in port.items() if k != "nodePort"} for port in spec.get("ports") or []],
    }
    if spec.get("clusterIP") == "None":
        copied["clusterIP"] = "None"
    for key in ("publishNotReadyAddresses", "sessionAffinity", "sessionAffinityConfig"):
        if key in spec:
            copied[key] = spec[key]
    digest = hashlib.sha256(json.dumps(copied, sort_keys=True).encode()).hexdigest()[:16]
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": _copy_name(namespace, meta["name"], legacy=legacy),
                     "labels": copy_labels(consumer_id=consumer_id, namespace=namespace),
                     "annotations": {ORIGIN_NAMESPACE: namespace, ORIGIN_NAME: meta["name"], SOURCE_DIGEST: digest}},
        "spec": copied,
    }  # fmt: skip


CopyLost = Literal["recreate", "fail"]


def when_copy_lost(restart_policy: str | None) -> CopyLost:
    """A copy deleted in the provider behind our back: a pod that restarts (restartPolicy Always or
    OnFailure, a Deployment's) gets a new copy, as a kubelet restarts its containers; one that never
    restarts fails, with a reason."""
    return "fail" if restart_policy == "Never" else "recreate"


# At most this many addresses of a copy are looked at (a pod has one per family): a status listing more is
# no pod's, and the Warning that names the foreign ones stays short.
MAX_REPORTED_IPS = 4
# A provider that keeps reporting foreign addresses is warned about once per pod in this time, or again at
# once when the addresses change.
FOREIGN_IP_WARNING_SECONDS = 600


def _inside(ip: str, cidr: str | None) -> bool:
    try:
        return cidr is not None and ipaddress.ip_address(ip) in ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return False


def remap_ip(ip: str, *, provider_pod_cidr: str | None, remapped_pod_cidr: str | None) -> str | None:
    """A provider pod's IP as the consumer reaches it, or None when it is not shown. Only an address inside
    the PodCIDR the provider advertised is a pod's: it is shown through the network module's remapping
    (the same host part in the remapped block), or as it is when the network says no remapping is needed
    (NO_REMAPPING). Anything else (another address of the consumer's own, such as its API server's Service,
    which a consumer Service's EndpointSlice would then send traffic to; a provider node's address, which is
    what a host-network pod reports and which the network module does not route; or no address at all) is
    not shown, nor is any address while the remapping is not known yet."""
    if not _inside(ip, provider_pod_cidr) or not remapped_pod_cidr:
        return None
    address = ipaddress.ip_address(ip)
    if remapped_pod_cidr == NO_REMAPPING:
        return str(address)
    try:
        advertised = ipaddress.ip_network(provider_pod_cidr or "", strict=False)
        remapped = ipaddress.ip_network(remapped_pod_cidr, strict=False)
    except ValueError:
        return None
    if (advertised.version, advertised.prefixlen) != (remapped.version, remapped.prefixlen):
        return None
    return str(remapped.network_address + (int(address) - int(advertised.network_address)))


class ConsumerStatus(NamedTuple):
    status: dict[str, Any]
    # What the provider reported outside its advertised PodCIDR (or not an address): not shown, and warned of.
    foreign_ips: tuple[str, ...] = ()


def status_for_consumer(copy_status: dict[str, Any], *, shape: StatusShape, provider_pod_cidr: str | None,
                        remapped_pod_cidr: str | None) -> ConsumerStatus:  # fmt: skip
    """What of the copy's status the consumer's pod shows (models/pods.py: copied_status, bounded by the
    pod's `shape`), its IPs remapped: the consumer's EndpointSlice controller then lists the pod among the
    local ones, with its readiness. Of the addresses reported, only one inside the advertised PodCIDR is
    shown (`remap_ip`; one CIDR, so one family); the others are the foreign ones."""
    status = copied_status(copy_status, shape=shape)
    entries = copy_status.get("podIPs")
    reported = [copy_status.get("podIP"), *((e.get("ip") if isinstance(e, dict) else e)
                                           for e in (entries if isinstance(entries, list) else []))]  # fmt: skip
    addresses = list(dict.fromkeys(str(ip)[:64] for ip in reported if ip))[:MAX_REPORTED_IPS]
    if not addresses:
        return ConsumerStatus({k: v for k, v in status.items() if k not in ("podIP", "podIPs")})
    foreign = tuple(ip for ip in addresses if not _inside(ip, provider_pod_cidr))
    shown = [shown for ip in addresses
             if (shown := remap_ip(ip, provider_pod_cidr=provider_pod_cidr, remapped_pod_cidr=remapped_pod_cidr))][:1]  # fmt: skip
    status["podIP"] = shown[0] if shown else None
    status["podIPs"] = [{"ip": ip} for ip in shown] or None
    return ConsumerStatus(status, foreign)


def foreign_ip_message(foreign_ips: tuple[str, ...], *, provider_id: str, provider_pod_cidr: str | None) -> str:
    """The Warning on a consumer pod whose copy reported addresses that are not its provider's pods'."""
    return (f"provider {provider_id} reported {', '.join(foreign_ips)} as this pod's IP, outside the PodCIDR it "
            f"advertised and the network module decided for ({provider_pod_cidr or 'none'}): not shown, so no "
            "Service sends traffic there")


def safe_pod_spec(pod_spec: dict[str, Any], *, legacy_namespace: str | None = None) -> dict[str, Any]:
    """The spec the provider runs: unbound (its scheduler places it), without the consumer's service
    account and its token, and without what only makes sense in the consumer (tolerations for the virtual
    node, selectors, affinity, priority class). ConfigMaps and Secrets keep their names (their copies have
    them in the same remote namespace); under the single-namespace layout (`legacy_namespace`, the pod's
    namespace) they were renamed to their reflections."""
    spec = copy.deepcopy(pod_spec)
    for key in ("nodeName", "nodeSelector", "affinity", "tolerations", "priorityClassName", "priority",
                "serviceAccountName", "serviceAccount", "schedulerName", "preemptionPolicy", "runtimeClassName",
                "overhead", "topologySpreadConstraints"):  # fmt: skip
        spec.pop(key, None)
    strip_service_account_token(spec)
    if legacy_namespace is not None:
        _rename_references(spec, lambda name: reflected_name(legacy_namespace, name))
    return spec


def _rename_references(spec: dict[str, Any], rename: Callable[[str], str]) -> None:
    for volume in spec.get("volumes") or []:
        if (volume.get("configMap") or {}).get("name"):
            volume["configMap"]["name"] = rename(volume["configMap"]["name"])
        if (volume.get("secret") or {}).get("secretName"):
            volume["secret"]["secretName"] = rename(volume["secret"]["secretName"])
        for source in (volume.get("projected") or {}).get("sources") or []:
            for kind in ("configMap", "secret"):
                if (source.get(kind) or {}).get("name"):
                    source[kind]["name"] = rename(source[kind]["name"])
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        for env in container.get("env") or []:
            for kind in ("configMapKeyRef", "secretKeyRef"):
                ref = (env.get("valueFrom") or {}).get(kind)
                if ref and ref.get("name"):
                    ref["name"] = rename(ref["name"])
        for source in container.get("envFrom") or []:
            for kind in ("configMapRef", "secretRef"):
                if (source.get(kind) or {}).get("name"):
                    source[kind]["name"] = rename(source[kind]["name"])


# How long past its grace period a copy may stay Terminating in the provider before teardown force-deletes
# it: a provider node that never confirms a deletion must not hold the teardown (and the namespace) for ever.
FORCE_DELETE_AFTER_GRACE_SECONDS = 10


def overdue_for_force_delete(deletion_deadline: datetime | None, *, now: datetime) -> bool:
    """A pod's deletionTimestamp is the end of its grace period; past it by the margin, teardown stops waiting."""
    return deletion_deadline is not None and (now - deletion_deadline).total_seconds() > FORCE_DELETE_AFTER_GRACE_SECONDS


def virtual_node(
    *, provider_id: str, resources: dict[str, str], ready: bool, reason: str, message: str, heartbeat: str,
    transition: str, address: str | None = None, kubelet_port: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """The virtual node standing for the provider: its capacity is the Advertisement's, and only pods
    that tolerate its taint land on it. The API server reaches its kubelet API (logs, exec) at the
    InternalIP `address` and `kubelet_port`; its name resolves nowhere, so no Hostname address is given
    (the API server tries Hostname first)."""
    name = virtual_node_name(provider_id)
    addresses = [{"type": "InternalIP", "address": address} if address else {"type": "Hostname", "address": name}]
    capacity = {"pods": "110", **resources}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {
            LABEL_NODE_TYPE: VIRTUAL_NODE_TYPE, LABEL_PROVIDER: provider_id, "type": VIRTUAL_NODE_TYPE,
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/role": "agent"}},
        "spec": {"taints": [{"key": TAINT_VIRTUAL_NODE, "value": "true", "effect": "NoExecute"}]},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": reason,
                            "message": message, "lastHeartbeatTime": heartbeat, "lastTransitionTime": transition}],
            "nodeInfo": {"kubeletVersion": "tidepool", "operatingSystem": "linux", "architecture": "amd64",
                         "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "tidepool",
                         "containerRuntimeVersion": "tidepool://provider", "kubeProxyVersion": ""},
            "addresses": addresses,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        },
    }  # fmt: skip


def node_status_report_due(
    previous: dict[str, Any] | None, current: dict[str, Any], *, since_last_report: float, report_every: float
) -> bool:
    """Whether the node's status must be written now, as a kubelet decides: when something in it other
    than the heartbeat time changed (Ready status, reason or message, capacity, addresses...), or when the
    last report is `report_every` seconds old. The Lease, not this, is the heartbeat."""
    if previous is None or since_last_report >= report_every:
        return True
    return _without_heartbeat(previous) != _without_heartbeat(current)


def _without_heartbeat(status: dict[str, Any]) -> dict[str, Any]:
    conditions = [{k: v for k, v in c.items() if k != "lastHeartbeatTime"} for c in status.get("conditions") or []]
    return {**status, "conditions": conditions}


# ---------------------------------------------------------------------------------------------------
# Namespace offloading (issue 35): each offloaded consumer namespace has a remote namespace of its own in
# the provider, which the virtual kubelet asks for (a RemoteNamespace in its control namespace) and reports
# on (its entry in the NamespaceOffloading's status.clusters).


class RemoteTarget(NamedTuple):
    """A consumer namespace's remote namespace in this provider, as the virtual kubelet last saw it."""

    remote: str
    phase: RemoteNamespacePhase
    message: str = ""


def remote_namespace_request(*, remote: str, consumer_namespace: str, consumer_id: str) -> dict[str, Any]:
    """The RemoteNamespace a virtual kubelet creates in its control namespace for one consumer namespace."""
    return {
        "apiVersion": API_VERSION, "kind": "RemoteNamespace",
        "metadata": {"name": remote, "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CONSUMER: consumer_id}},
        "spec": {"consumerNamespace": consumer_namespace},
    }  # fmt: skip


def remote_target(request: Mapping[str, Any] | None, *, remote: str, consumer_namespace: str) -> RemoteTarget:
    """What the RemoteNamespace `remote` says for `consumer_namespace`: the provider's phase and message; Pending
    before the provider answered; Refused when the name is another namespace's request of this consumer (two
    namespaces offloaded under one SelectedName); Deleting while a former request of the name goes."""
    if request is None:
        return RemoteTarget(remote, "Pending", "requested")
    meta, status = request.get("metadata") or {}, request.get("status") or {}
    asked_for = clipped("consumerNamespace", (request.get("spec") or {}).get("consumerNamespace"))
    if asked_for != consumer_namespace:
        return RemoteTarget(remote, "Refused", f"remote namespace {remote} is already requested for namespace "
                                               f"{asked_for} of this cluster")  # fmt: skip
    if meta.get("deletionTimestamp"):
        return RemoteTarget(remote, "Deleting", f"remote namespace {remote} is being deleted")
    said = str(status.get("phase") or "Pending")
    phase: RemoteNamespacePhase = next((p for p in get_args(RemoteNamespacePhase) if p == said), "Pending")
    # The provider wrote it: cut to a message's bound here, before it reaches the entry, a pod's condition or an Event.
    said_message = clipped("message", status.get("message"))
    return RemoteTarget(remote, phase, str(said_message or ("requested" if phase == "Pending" else "")))


def offloading_entry(*, provider_id: str, target: RemoteTarget) -> dict[str, str]:
    """This provider's entry in a NamespaceOffloading's status.clusters (NamespaceOffloadingStatus.clusters)."""
    return {"clusterId": provider_id, "remoteNamespace": target.remote, "phase": target.phase,
            "message": clipped("message", target.message)}  # fmt: skip


def namespace_not_ready_message(namespace: str, *, provider_id: str, target: RemoteTarget | None,
                                offloaded: bool) -> str:  # fmt: skip
    """Why a pod of `namespace` bound to this provider's virtual node gets no copy (reason NamespaceNotReady)."""
    if target is None and not offloaded:
        return f"namespace {namespace} is not offloaded: run `tidepool offload namespace {namespace}`"
    if target is None:
        return f"namespace {namespace} is offloaded, but its cluster selector does not select provider {provider_id}"
    where = f"remote namespace {target.remote} of namespace {namespace} in provider {provider_id}"
    match target.phase:
        case "Refused":
            return (f"provider {provider_id} refused remote namespace {target.remote} for namespace {namespace}: "
                    f"{target.message}")
        case "Deleting":
            return f"{where} is being deleted"
        case "Ready":
            return f"{where} is ready"
        case _:
            return f"{where} is pending" + (f": {target.message}" if target.message else "")


def legacy_copy_may_go(new_copy_status: Mapping[str, Any], *, restart_policy: str | None) -> bool:
    """Whether a pod's copy of the single-namespace layout may be deleted, its pod having a copy in its remote
    namespace too: only once that one runs (phase Running and Ready), so the pod is never without a running
    copy. A pod that runs to completion (restartPolicy Never or OnFailure, a Job's) never moves: a second copy
    would do its work a second time; it keeps its old copy until it is done."""
    if (restart_policy or "Always") != "Always":
        return False
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in new_copy_status.get("conditions") or [])
    return new_copy_status.get("phase") == "Running" and ready


def moves_to_remote_namespace(restart_policy: str | None) -> bool:
    """A pod with a copy of the single-namespace layout gets a second copy in its remote namespace (and then
    loses the old one) only if it restarts for ever (`legacy_copy_may_go`)."""
    return (restart_policy or "Always") == "Always"
