"""The pool's syncer, one per super cluster: `python -m workers.syncer`. It copies every object of the
tenant namespaces placed on its cluster down (the namespace itself, prefixed with the tenant's name, and
the kinds of models/pool/sync.py: SYNCED_KINDS), only the pods placed on its cluster, and status back up:
pod status, and, when its cluster is the namespace's status cluster, LoadBalancer addresses and PVC
binding; Events about the pods' copies become Events on the tenant pods. A namespace whose placement no
longer names this cluster, and that no longer drains from it, is deleted here; a pod moved away keeps its
copy here, silent, until its move ends (models/pool/moves.py). Behind the feature gate SuperClusterPooling;
with the gate off it syncs everything, as virtualcluster's syncer does without a pool.

Level-triggered: watches wake it and say which kinds of which namespace changed; a pass lists and
compares both sides of those kinds only, and of every kind at a start, after a relist and every
RESYNC_SECONDS. A copy whose source digest is unchanged costs no write."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from collections import OrderedDict
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kube.clients import client_from_own_kubeconfig_file
from kube.clock import utcnow
from kube.errors import already_exists
from kube.informer import Informer
from kube.metadata import served_metadata
from kube.objects import APPLY, ignore_not_found, record_event
from kube.process import wait_for_termination
from models.enforcement import status_message
from models.names import (
    FEATURE_SUPER_CLUSTER_POOLING,
    LABEL_MANAGED_BY,
    LABEL_SUPER_CLUSTER,
    LABEL_TENANT_NAMESPACE,
    MANAGED_BY,
    MOVED_FROM_ANNOTATION,
    POD_CLUSTER_ANNOTATION,
    super_cluster_namespace,
)
from models.pods import (
    MAX_REMEMBERED_EVENTS,
    ReflectedEvents,
    copied_status,
    event_for_origin,
    says,
    status_patch,
    status_shape,
)
from models.pool.moves import (
    draining_of,
    refused_status,
    scheduled_of,
)
from models.pool.namespaces import SYSTEM_NAMESPACES, placement_of
from models.pool.sync import (
    API_VERSIONS,
    SYNCED_KINDS,
    copy_for_super,
    copy_stays_here,
    in_scope,
    is_copy,
    kinds_to_sync,
    load_balancer_status,
    mirror_volume,
    pod_for_super,
    pod_goes_here,
    selectorless_services,
    stale_mirrors,
    status_cluster,
    super_namespace_labels,
    unchanged,
)
from models.times import format_rfc3339

log = logging.getLogger("tidepool.syncer")
RESYNC_SECONDS = 10
FIELD_MANAGER = "tidepool-syncer"


def _items(response: Any) -> list[dict[str, Any]]:
    return list(json.loads(response.data).get("items", []))


class Syncer:
    def __init__(self, *, tenant: k8s.ApiClient, super_cluster: k8s.ApiClient, cluster: str, tenant_name: str,
                 pooling: bool = True) -> None:  # fmt: skip
        self.cluster, self.tenant_name, self.pooling = cluster, tenant_name, pooling
        self.up, self.down = k8s.CoreV1Api(tenant), k8s.CoreV1Api(super_cluster)
        self._apis = {"tenant": _KindApis(tenant), "super": _KindApis(super_cluster)}
        self._wake, self._stop = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._changed: dict[str, set[str]] = {}  # tenant namespace -> kinds a watch saw change there
        self._everything = True  # the next pass copies every kind of every namespace
        self._this_pass: dict[str, set[str]] | None = None  # what the running pass copies; None: everything
        self._targets: dict[str, str] = {}  # super namespace -> tenant namespace, as the last passes synced
        self._events: OrderedDict[str, dict[str, Any]] = OrderedDict()  # source Events to reflect, by uid
        self._reflected = ReflectedEvents()
        managed = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_TENANT_NAMESPACE}"
        self._informers = [
            # A namespace placed, moved or created: all of its kinds go (again).
            Informer(f"syncer-{cluster}-namespaces", self.up.list_namespace, on_sync=self._resync, on_event=self._resync),
            Informer(f"syncer-{cluster}-pods", self.up.list_pod_for_all_namespaces, on_sync=self._poke, on_event=self._poke),
            Informer(f"syncer-{cluster}-super-pods", self.down.list_pod_for_all_namespaces, label_selector=managed,
                     on_sync=self._poke, on_event=self._poke),
            *(Informer(f"syncer-{cluster}-{kind.lower()}", self._apis["tenant"].list_all(kind),
                       on_sync=self._resync, on_event=self._changed_in_tenant(kind)) for kind in SYNCED_KINDS),
            # Status comes up from these: a load balancer's addresses, a claim's binding.
            *(Informer(f"syncer-{cluster}-super-{kind.lower()}", self._apis["super"].list_all(kind),
                       label_selector=managed, on_sync=self._resync, on_event=self._changed_in_super(kind))
              for kind in ("Service", "PersistentVolumeClaim")),
            Informer(f"syncer-{cluster}-super-events", self.down.list_event_for_all_namespaces,
                     field_selector="involvedObject.kind=Pod", on_sync=self._events_listed, on_event=self._event_seen),
        ]  # fmt: skip
        self._thread = threading.Thread(target=self._loop, name=f"syncer-{cluster}", daemon=True)

    def _poke(self, *_: Any) -> None:
        self._wake.set()

    def _resync(self, *_: Any) -> None:
        self._everything = True
        self._wake.set()

    def _note(self, kind: str, tenant_ns: str | None) -> None:
        if tenant_ns:
            with self._lock:
                self._changed.setdefault(tenant_ns, set()).add(kind)
            self._wake.set()

    def _changed_in_tenant(self, kind: str) -> Any:
        return lambda _type, obj: self._note(kind, obj.get("metadata", {}).get("namespace"))

    def _changed_in_super(self, kind: str) -> Any:
        return lambda _type, obj: self._note(kind, (obj.get("metadata", {}).get("labels") or {}).get(
            LABEL_TENANT_NAMESPACE))  # fmt: skip

    def _events_listed(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            self._event_seen("ADDED", event)

    def _event_seen(self, kind: str, event: dict[str, Any]) -> None:
        if kind == "DELETED":
            return
        with self._lock:  # bounded: a burst beyond it keeps the newest, the super cluster aggregates the rest
            self._events[event["metadata"]["uid"]] = event
            self._events.move_to_end(event["metadata"]["uid"])
            while len(self._events) > MAX_REMEMBERED_EVENTS:
                self._events.popitem(last=False)
        self._wake.set()

    def start(self) -> Syncer:
        for informer in self._informers:
            informer.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for informer in self._informers:
            informer.stop()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            with self._lock:
                self._this_pass = None if self._everything else self._changed
                self._changed, self._everything = {}, False
            try:
                self.reconcile()
                self._reflect_events()
            except Exception as e:  # noqa: BLE001 - the next pass tries again, with every kind
                self._everything = True
                # Never str(ApiException): it carries the response's headers and body.
                said = f"{e.status} {e.reason}" if isinstance(e, ApiException) else str(e)
                log.warning("syncer %s: pass failed: %s", self.cluster, said)
            if not self._wake.wait(RESYNC_SECONDS):
                self._everything = True

    def reconcile(self) -> None:
        wanted: dict[str, str] = {}  # tenant namespace -> super namespace
        for ns in map(served_metadata, self.up.list_namespace().items):
            name = ns.name
            if name in SYSTEM_NAMESPACES or name.startswith("kube-") or ns.deleting:
                continue
            if in_scope(placement_of(ns.annotations), self.cluster, pooling=self.pooling,
                        scheduled=scheduled_of(ns.annotations),
                        draining=draining_of(ns.annotations)):  # fmt: skip
                wanted[name] = super_cluster_namespace(self.tenant_name, name)
        for tenant_ns, target in wanted.items():
            self._sync_namespace(tenant_ns, target)
        for copy in map(served_metadata, self.down.list_namespace(label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}").items):
            origin = copy.labels.get(LABEL_TENANT_NAMESPACE)
            if origin and origin not in wanted and not copy.deleting:
                log.info("syncer %s: %s left the placement, deleting %s", self.cluster, origin, copy.name)
                ignore_not_found(self.down.delete_namespace, copy.name)

    def _sync_namespace(self, tenant_ns: str, target: str) -> None:
        self.down.patch_namespace(target, {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": target, "labels": super_namespace_labels(tenant_ns)}},
                                  field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)  # fmt: skip
        self._targets[target] = tenant_ns
        self._sync_copies(tenant_ns, target)
        self._sync_pods(tenant_ns, target)

    def _sync_copies(self, tenant_ns: str, target: str) -> None:
        """Copies down the kinds that may differ, then brings their status up. A failure names the object and
        kind and does not stop the others (an object the super cluster refuses must not block the rest)."""
        changed = None if self._this_pass is None else self._this_pass.get(tenant_ns, set())
        kinds = kinds_to_sync(changed)
        if not kinds:
            return
        up, down = self._apis["tenant"], self._apis["super"]
        selector = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        sources = {kind: up.list(kind, tenant_ns) for kind in kinds}
        copies = {kind: {o["metadata"]["name"]: o for o in down.list(kind, target, label_selector=selector)
                         if is_copy(kind, o)} for kind in kinds}  # fmt: skip
        selectorless = selectorless_services(sources.get("Service", []))
        for kind in kinds:
            keep = set()
            for obj in sources[kind]:
                body = copy_for_super(kind, obj, target_namespace=target, tenant_namespace=tenant_ns,
                                      selectorless_services=selectorless)  # fmt: skip
                if body is None:
                    continue
                name = body["metadata"]["name"]
                keep.add(name)
                if not unchanged(copies[kind].get(name), body):
                    self._try(f"copying {kind} {tenant_ns}/{name} to {target}", down.apply, kind, target, body)
            for stale in set(copies[kind]) - keep:
                self._try(f"deleting the copy {kind} {target}/{stale}", down.delete, kind, target, stale)
        if {"Service", "PersistentVolumeClaim"} & set(kinds) and self._shows_status(tenant_ns):
            self._status_up(tenant_ns, sources, copies)

    def _shows_status(self, tenant_ns: str) -> bool:
        """This cluster is the namespace's status cluster (models/pool/sync.py: status_cluster)."""
        if not self.pooling:
            return True
        annotations = served_metadata(self.up.read_namespace(tenant_ns)).annotations
        return status_cluster(placement_of(annotations)) == self.cluster

    def _status_up(self, tenant_ns: str, sources: dict[str, list[dict[str, Any]]],
                   copies: dict[str, dict[str, dict[str, Any]]]) -> None:  # fmt: skip
        for service in sources.get("Service", []):
            name = service["metadata"]["name"]
            copy = copies["Service"].get(name)
            status = load_balancer_status(service, copy) if copy else None
            if status is not None:
                self._try(f"writing the load balancer status of Service {tenant_ns}/{name}",
                          self.up.patch_namespaced_service_status, name, tenant_ns, {"status": status})  # fmt: skip
        if "PersistentVolumeClaim" not in sources:
            return
        claims = sources["PersistentVolumeClaim"]
        for claim in claims:
            name = claim["metadata"]["name"]
            copy = copies["PersistentVolumeClaim"].get(name)
            volume = mirror_volume(claim, copy, cluster=self.cluster, tenant_namespace=tenant_ns) if copy else None
            if volume is not None and (claim.get("spec") or {}).get("volumeName") != volume["metadata"]["name"]:
                self._try(f"mirroring the volume of PersistentVolumeClaim {tenant_ns}/{name}",
                          self.up.patch_persistent_volume, volume["metadata"]["name"], volume, field_manager=FIELD_MANAGER, force=True,
                          _content_type=APPLY)  # fmt: skip
        mine = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_TENANT_NAMESPACE}={tenant_ns},{LABEL_SUPER_CLUSTER}={self.cluster}"
        mirrors = _items(self.up.list_persistent_volume(label_selector=mine, _preload_content=False))
        for stale in stale_mirrors(mirrors, claims):
            self._try(f"deleting the mirrored PersistentVolume {stale}", ignore_not_found,
                      self.up.delete_persistent_volume, stale)  # fmt: skip

    def _try(self, what: str, call: Any, *args: Any, **kwargs: Any) -> None:
        try:
            call(*args, **kwargs)
        except ApiException as e:
            self._everything = True  # try again at the next pass, whatever wakes it
            log.warning("syncer %s: %s failed: %s %s", self.cluster, what, e.status, e.reason)

    def _reflect_events(self) -> None:
        """Events about pods' copies, as Events on the tenant pods: only for pods placed here (a cluster a pod
        has left pushes nothing up), once per change of each source Event."""
        with self._lock:
            events, self._events = list(self._events.values()), OrderedDict()
        for event in events:
            involved = event.get("involvedObject") or {}
            tenant_ns = self._targets.get(involved.get("namespace") or "")
            if tenant_ns is None or not self._reflected.is_new(event):
                continue
            pod: Any = ignore_not_found(self.up.read_namespaced_pod, involved.get("name"), tenant_ns,
                                        _preload_content=False)  # fmt: skip
            if pod is None:
                self._reflected.remember(event)
                continue
            tenant_pod = json.loads(pod.data)
            placed = (tenant_pod["metadata"].get("annotations") or {}).get(POD_CLUSTER_ANNOTATION)
            if not pod_goes_here(placed, self.cluster, pooling=self.pooling):
                continue
            body = event_for_origin(event, tenant_pod, labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_SUPER_CLUSTER: self.cluster})
            try:
                self.up.create_namespaced_event(tenant_ns, k8s.CoreV1Event.model_validate(body))
            except ApiException as e:
                if not already_exists(e):
                    log.warning("syncer %s: reflecting Event %s on Pod %s/%s failed: %s %s", self.cluster,
                                event["metadata"]["name"], tenant_ns, involved.get("name"), e.status, e.reason)  # fmt: skip
                    continue
                self.up.patch_namespaced_event(body["metadata"]["name"], tenant_ns, {key: body[key] for key in (
                    "count", "message", "lastTimestamp") if key in body})  # fmt: skip
            self._reflected.remember(event)

    def _sync_pods(self, tenant_ns: str, target: str) -> None:
        tenant_pods = _items(self.up.list_namespaced_pod(tenant_ns, _preload_content=False))
        super_pods = {p["metadata"]["name"]: p for p in _items(self.down.list_namespaced_pod(
            target, label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}", _preload_content=False))}  # fmt: skip
        mine = set()
        for pod in tenant_pods:
            meta = pod["metadata"]
            annotations = meta.get("annotations") or {}
            copy = super_pods.get(meta["name"])
            if copy_stays_here(annotations.get(MOVED_FROM_ANNOTATION), self.cluster, pooling=self.pooling):
                if not meta.get("deletionTimestamp"):
                    mine.add(meta["name"])
                continue
            if not pod_goes_here(annotations.get(POD_CLUSTER_ANNOTATION), self.cluster, pooling=self.pooling):
                continue
            mine.add(meta["name"])
            if meta.get("deletionTimestamp"):
                if copy is not None:
                    ignore_not_found(self.down.delete_namespaced_pod, meta["name"], target)
                else:
                    ignore_not_found(self.up.delete_namespaced_pod, meta["name"], tenant_ns, grace_period_seconds=0)
            elif copy is None:
                try:
                    self.down.create_namespaced_pod(target, k8s.V1Pod.model_validate(pod_for_super(
                        pod, target_namespace=target, tenant_namespace=tenant_ns)))  # fmt: skip
                except ApiException as e:
                    if e.status == 403:  # its Pod Security level (or another admission rule) refuses it
                        self._refused(pod, tenant_ns, status_message(e.body) or str(e.reason))
                    elif not already_exists(e):
                        raise
            else:
                status = copied_status(copy.get("status") or {}, shape=status_shape(pod.get("spec") or {}))
                if not says(pod.get("status"), status):  # the pool's own condition on the pod is no difference
                    self._push_status(pod, tenant_ns, status)
        for name in set(super_pods) - mine:
            ignore_not_found(self.down.delete_namespaced_pod, name, target)

    def _refused(self, pod: dict[str, Any], tenant_ns: str, why: str) -> None:
        """The tenant pod says why the super cluster refuses it, once (its spec does not change: trying again
        at each pass costs one refused create, and a pod the rules allow later, or that moves, runs then)."""
        status = refused_status(cluster=self.cluster, why=why, now=format_rfc3339(utcnow()))
        if says(pod.get("status"), status):
            return
        self.up.patch_namespaced_pod_status(pod["metadata"]["name"], tenant_ns, {"status": status})
        record_event(self.up.api_client, {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]},
                     reason="SuperClusterRefused", message=status["message"], warning=True)  # fmt: skip

    def _push_status(self, pod: dict[str, Any], tenant_ns: str, status: dict[str, Any]) -> None:
        """Only onto the pod as it was read: if the pool scheduler moved it meanwhile (another cluster's
        copy owns its status now), the write is refused and the next pass reads it anew."""
        meta = pod["metadata"]
        try:
            self.up.patch_namespaced_pod_status(meta["name"], tenant_ns, {
                "metadata": {"resourceVersion": meta["resourceVersion"]}, **status_patch(status)})  # fmt: skip
        except ApiException as e:
            if e.status != 409:
                raise




class _KindApis:
    """List, apply and delete of every synced kind in one cluster, by kind name."""

    SNAKE = {"ConfigMap": "config_map", "Secret": "secret", "Service": "service",
             "ServiceAccount": "service_account", "ResourceQuota": "resource_quota", "LimitRange": "limit_range",
             "PersistentVolumeClaim": "persistent_volume_claim", "Endpoints": "endpoints",
             "EndpointSlice": "endpoint_slice", "Ingress": "ingress", "NetworkPolicy": "network_policy"}  # fmt: skip

    def __init__(self, api: k8s.ApiClient) -> None:
        by_version = {"v1": k8s.CoreV1Api(api), "discovery.k8s.io/v1": k8s.DiscoveryV1Api(api),
                      "networking.k8s.io/v1": k8s.NetworkingV1Api(api)}  # fmt: skip
        self._api = {kind: by_version[version] for kind, version in API_VERSIONS.items()}

    def _call(self, verb: str, kind: str) -> Any:
        return getattr(self._api[kind], verb.format(self.SNAKE[kind]))

    def list_all(self, kind: str) -> Any:
        return self._call("list_{}_for_all_namespaces", kind)

    def list(self, kind: str, namespace: str, **kwargs: Any) -> list[dict[str, Any]]:
        return _items(self._call("list_namespaced_{}", kind)(namespace, _preload_content=False, **kwargs))

    def apply(self, kind: str, namespace: str, body: dict[str, Any]) -> None:
        self._call("patch_namespaced_{}", kind)(body["metadata"]["name"], namespace, body,
                                                 field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)  # fmt: skip

    def delete(self, kind: str, namespace: str, name: str) -> None:
        ignore_not_found(self._call("delete_namespaced_{}", kind), name, namespace)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m workers.syncer", description=__doc__)
    parser.add_argument("--tenant-kubeconfig", help="unset: in-cluster, as its Deployment runs (deploy/pool/tenant)")
    parser.add_argument("--super-kubeconfig", required=True)
    parser.add_argument("--cluster", required=True, help="this super cluster's name in the pool (its SuperCluster)")
    parser.add_argument("--tenant-name", default="tenant", help="prefix of the namespaces it creates")
    parser.add_argument("--feature-gates", default=f"{FEATURE_SUPER_CLUSTER_POOLING}=true")
    args = parser.parse_args()
    gates = dict(item.split("=", 1) for item in args.feature_gates.split(",") if "=" in item)
    syncer = Syncer(tenant=client_from_own_kubeconfig_file(args.tenant_kubeconfig),
                    super_cluster=client_from_own_kubeconfig_file(args.super_kubeconfig), cluster=args.cluster,
                    tenant_name=args.tenant_name, pooling=gates.get(FEATURE_SUPER_CLUSTER_POOLING, "true") == "true").start()
    wait_for_termination()
    syncer.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
