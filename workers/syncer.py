"""The pool's syncer, one per super cluster: `python -m workers.syncer`. It copies every object of the
tenant namespaces placed on its cluster down (the namespace itself, prefixed with the tenant's name, and
the kinds of models/pool/sync.py: SYNCED_KINDS), only the pods placed on its cluster, and status back up:
pod status, and, when its cluster is the namespace's status cluster, LoadBalancer addresses and PVC
binding; Events about the pods' copies become Events on the tenant pods. A namespace whose placement no
longer names this cluster, and that no longer drains from it, is deleted here; a pod moved away keeps its
copy here, silent, until its move ends (models/pool/moves.py). Behind the feature gate SuperClusterPooling;
with the gate off it syncs everything, as virtualcluster's syncer does without a pool.

Level-triggered, as the virtual kubelet's reflection (kube/workqueue.py): informers keep both sides in
Stores (the tenant's namespaces, pods and synced kinds; the super cluster's namespaces and copies), every
change of either side queues the key (tenant namespace, kind, name) of what it concerns, and the handler
reads both sides of that one object from the Stores and writes what differs. A change of a namespace
queues everything in it; every RESYNC_SECONDS everything is queued again, a safety net for a write the
API server took but whose event never came. A copy whose source digest is unchanged costs no write."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kube.clients import client_from_own_kubeconfig_file
from kube.clock import utcnow
from kube.errors import already_exists
from kube.informer import Informer, Store
from kube.objects import APPLY, ignore_not_found, record_event
from kube.process import wait_for_termination
from kube.workqueue import WorkQueue, namespace_of
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
    endpoints_of,
    in_scope,
    is_copy,
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
RESYNC_SECONDS = 300
# Handlers at once: each is a few API calls of one object.
WORKERS = 4
FIELD_MANAGER = "tidepool-syncer"
Obj = dict[str, Any]
Key = tuple[str, str, str]  # (tenant namespace, kind, name)
NAMESPACE, POD = "Namespace", "Pod"
EVENTS: Key = ("", "Event", "")  # the Events seen since the last reflection
Named = tuple[str, str]  # (namespace, name), of either side


def _items(response: Any) -> list[dict[str, Any]]:
    return list(json.loads(response.data).get("items", []))


def _named(obj: Obj) -> Named:
    return obj["metadata"].get("namespace") or "", obj["metadata"]["name"]


def _trimmed(obj: Obj) -> Obj:
    obj.get("metadata", {}).pop("managedFields", None)  # the bulk of most objects, and read by nobody here
    return obj


def _labels(obj: Obj) -> dict[str, str]:
    return obj.get("metadata", {}).get("labels") or {}


def _annotations(obj: Obj) -> dict[str, str]:
    return obj.get("metadata", {}).get("annotations") or {}


def _deleting(obj: Obj) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


class Syncer:
    def __init__(self, *, tenant: k8s.ApiClient, super_cluster: k8s.ApiClient, cluster: str, tenant_name: str,
                 pooling: bool = True) -> None:  # fmt: skip
        self.cluster, self.tenant_name, self.pooling = cluster, tenant_name, pooling
        self.up, self.down = k8s.CoreV1Api(tenant), k8s.CoreV1Api(super_cluster)
        self._apis = {"tenant": _KindApis(tenant), "super": _KindApis(super_cluster)}
        self.queue: WorkQueue[Key] = WorkQueue(f"syncer-{cluster}", self._handle, workers=WORKERS,
                                                owner=namespace_of)  # one tenant's burst holds no other back
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._events: OrderedDict[str, dict[str, Any]] = OrderedDict()  # source Events to reflect, by uid
        self._reflected = ReflectedEvents()
        # The tenant's side, by (namespace, name), and the super cluster's copies, by (super namespace, name).
        self._namespaces: Store[str, Obj] = Store(lambda o: o["metadata"]["name"],
                                                  lambda name, _old, _new: self.queue.add((name, NAMESPACE, "")))
        self._copy_namespaces: Store[str, Obj] = Store(lambda o: o["metadata"]["name"], self._copy_namespace_changed)
        self._sources: dict[str, Store[Named, Obj]] = {
            kind: Store(_named, self._source_changed(kind)) for kind in (POD, *SYNCED_KINDS)}
        self._copies: dict[str, Store[Named, Obj]] = {
            kind: Store(_named, self._copy_changed(kind)) for kind in (POD, *SYNCED_KINDS)}
        managed = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_TENANT_NAMESPACE}"
        self._informers = [
            self._informer("namespaces", self._namespaces, self.up.list_namespace),
            self._informer("pods", self._sources[POD], self.up.list_pod_for_all_namespaces),
            *(self._informer(kind.lower(), self._sources[kind], self._apis["tenant"].list_all(kind))
              for kind in SYNCED_KINDS),
            self._informer("super-namespaces", self._copy_namespaces, self.down.list_namespace, label_selector=managed),
            self._informer("super-pods", self._copies[POD], self.down.list_pod_for_all_namespaces,
                           label_selector=managed),
            *(self._informer(f"super-{kind.lower()}", self._copies[kind], self._apis["super"].list_all(kind),
                             label_selector=managed) for kind in SYNCED_KINDS),
            Informer(f"syncer-{cluster}-super-events", self.down.list_event_for_all_namespaces,
                     field_selector="involvedObject.kind=Pod", on_sync=self._events_listed, on_event=self._event_seen),
        ]  # fmt: skip
        self._thread = threading.Thread(target=self._resync_loop, name=f"syncer-{cluster}", daemon=True)

    def _informer(self, name: str, store: Store[Any, Obj], list_call: Callable[..., Any], **kwargs: Any) -> Informer[Obj]:
        return Informer(f"syncer-{self.cluster}-{name}", list_call, on_sync=store.sync, on_event=store.event,
                        transform=_trimmed, **kwargs)  # fmt: skip

    def _source_changed(self, kind: str) -> Callable[[Named, Obj | None, Obj | None], None]:
        def changed(key: Named, _old: Obj | None, _new: Obj | None) -> None:
            self.queue.add((key[0], kind, key[1]))

        return changed

    def _copy_changed(self, kind: str) -> Callable[[Named, Obj | None, Obj | None], None]:
        def changed(key: Named, old: Obj | None, new: Obj | None) -> None:
            origin = _labels(new or old or {}).get(LABEL_TENANT_NAMESPACE)
            if origin:
                self.queue.add((origin, kind, key[1]))

        return changed

    def _copy_namespace_changed(self, _name: str, old: Obj | None, new: Obj | None) -> None:
        origin = _labels(new or old or {}).get(LABEL_TENANT_NAMESPACE)
        if origin:
            self.queue.add((origin, NAMESPACE, ""))

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
        self.queue.add(EVENTS)

    def start(self) -> Syncer:
        for informer in self._informers:
            informer.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for informer in self._informers:
            informer.stop()
        self.queue.stop()
        self._thread.join(timeout=10)

    def _resync_loop(self) -> None:
        """Handlers start once both sides are listed (a copy seen before its source is listed is not stale),
        then everything is queued again every RESYNC_SECONDS."""
        for informer in self._informers:
            while not informer.wait_synced(1):
                if self._stop.is_set():
                    return
        self.queue.start()
        while True:
            self.queue.add_all(list(self._everything()))
            if self._stop.wait(RESYNC_SECONDS):
                return

    def _everything(self) -> Iterator[Key]:
        yield from ((name, NAMESPACE, "") for name in self._namespaces.keys())
        yield from ((origin, NAMESPACE, "") for copy in self._copy_namespaces.values()
                    if (origin := _labels(copy).get(LABEL_TENANT_NAMESPACE)))  # fmt: skip
        for kind in (POD, *SYNCED_KINDS):
            yield from ((namespace, kind, name) for namespace, name in self._sources[kind].keys())
            yield from ((origin, kind, copy["metadata"]["name"]) for copy in self._copies[kind].values()
                        if (origin := _labels(copy).get(LABEL_TENANT_NAMESPACE)))  # fmt: skip
        yield EVENTS

    def _in(self, tenant_ns: str, target: str) -> Iterator[Key]:
        """Every object of a tenant namespace and of its copy."""
        for kind in (POD, *SYNCED_KINDS):
            yield from ((tenant_ns, kind, name) for namespace, name in self._sources[kind].keys() if namespace == tenant_ns)
            yield from ((tenant_ns, kind, name) for namespace, name in self._copies[kind].keys() if namespace == target)

    def _handle(self, key: Key) -> None:
        tenant_ns, kind, name = key
        if key == EVENTS:
            self._reflect_events()
            return
        target = self._target(tenant_ns)
        if kind == NAMESPACE:
            self._sync_namespace(tenant_ns, target)
        elif target is None:
            return  # its copy goes with the copy of its namespace
        elif kind == POD:
            self._sync_pod(tenant_ns, target, name)
        else:
            self._sync_copy(kind, tenant_ns, target, name)

    def _target(self, tenant_ns: str) -> str | None:
        """The namespace's copy here, if it is placed here."""
        ns = self._namespaces.get(tenant_ns)
        if ns is None or tenant_ns in SYSTEM_NAMESPACES or tenant_ns.startswith("kube-") or _deleting(ns):
            return None
        annotations = _annotations(ns)
        if not in_scope(placement_of(annotations), self.cluster, pooling=self.pooling,
                        scheduled=scheduled_of(annotations), draining=draining_of(annotations)):  # fmt: skip
            return None
        return super_cluster_namespace(self.tenant_name, tenant_ns)

    def _sync_namespace(self, tenant_ns: str, target: str | None) -> None:
        if target is None:
            for left in self._copy_namespaces.values():
                if _labels(left).get(LABEL_TENANT_NAMESPACE) == tenant_ns and not _deleting(left):
                    log.info("syncer %s: %s left the placement, deleting %s", self.cluster, tenant_ns,
                             left["metadata"]["name"])  # fmt: skip
                    ignore_not_found(self.down.delete_namespace, left["metadata"]["name"])
            return
        labels = super_namespace_labels(tenant_ns)
        copy = self._copy_namespaces.get(target)
        if copy is None or _deleting(copy) or labels.items() - _labels(copy).items():
            self.down.patch_namespace(target, {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": target, "labels": labels}},
                                      field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)  # fmt: skip
        # Its placement may have changed what goes here: everything in it is looked at again.
        self.queue.add_all(list(self._in(tenant_ns, target)))

    def _sync_copy(self, kind: str, tenant_ns: str, target: str, name: str) -> None:
        """One object of a synced kind down, then, for Services and claims, its status up."""
        source = self._sources[kind].get((tenant_ns, name))
        copy = self._copies[kind].get((target, name))
        if copy is not None and not is_copy(kind, copy):
            copy = None  # the super cluster's own (endpoints it derived): never deleted, overwritten by a copy
        body: Obj | None = None
        if source is not None:
            body = copy_for_super(kind, source, target_namespace=target, tenant_namespace=tenant_ns,
                                  selectorless_services=self._selectorless(tenant_ns, endpoints_of(kind, source)))  # fmt: skip
        if body is not None:
            if not unchanged(copy, body):
                self._apis["super"].apply(kind, target, body)
        elif copy is not None:
            self._apis["super"].delete(kind, target, name)
        if kind == "Service":  # whether its endpoints are copied follows from its selector
            self.queue.add((tenant_ns, "Endpoints", name))
            self.queue.add_all([(tenant_ns, "EndpointSlice", found) for found in self._slices(tenant_ns, target, name)])
        if kind in ("Service", "PersistentVolumeClaim") and self._shows_status(tenant_ns):
            self._status_up(kind, tenant_ns, source, copy)

    def _selectorless(self, tenant_ns: str, service: str | None) -> frozenset[str]:
        """The endpoints' Service, if it has no selector (its owner writes its endpoints, which are copied)."""
        found = self._sources["Service"].get((tenant_ns, service)) if service else None
        return selectorless_services([found]) if found is not None else frozenset()

    def _slices(self, tenant_ns: str, target: str, service: str) -> set[str]:
        """The EndpointSlices of a Service, on either side."""
        both = [*self._sources["EndpointSlice"].values(), *self._copies["EndpointSlice"].values()]
        return {o["metadata"]["name"] for o in both
                if _named(o)[0] in (tenant_ns, target) and endpoints_of("EndpointSlice", o) == service}  # fmt: skip

    def _shows_status(self, tenant_ns: str) -> bool:
        """This cluster is the namespace's status cluster (models/pool/sync.py: status_cluster)."""
        if not self.pooling:
            return True
        ns = self._namespaces.get(tenant_ns)
        return ns is not None and status_cluster(placement_of(_annotations(ns))) == self.cluster

    def _status_up(self, kind: str, tenant_ns: str, source: Obj | None, copy: Obj | None) -> None:
        if source is not None and copy is not None:
            name = source["metadata"]["name"]
            if kind == "Service" and (status := load_balancer_status(source, copy)) is not None:
                self.up.patch_namespaced_service_status(name, tenant_ns, {"status": status})
            volume = mirror_volume(source, copy, cluster=self.cluster, tenant_namespace=tenant_ns) \
                if kind == "PersistentVolumeClaim" else None  # fmt: skip
            if volume is not None and (source.get("spec") or {}).get("volumeName") != volume["metadata"]["name"]:
                self.up.patch_persistent_volume(volume["metadata"]["name"], volume, field_manager=FIELD_MANAGER,
                                                force=True, _content_type=APPLY)  # fmt: skip
        if kind == "PersistentVolumeClaim":  # a claim gone (or recreated: another uid): its mirrored volume goes
            claims = [c for c in self._sources[kind].values() if _named(c)[0] == tenant_ns]
            mine = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_TENANT_NAMESPACE}={tenant_ns},{LABEL_SUPER_CLUSTER}={self.cluster}"
            mirrors = _items(self.up.list_persistent_volume(label_selector=mine, _preload_content=False))
            for stale in stale_mirrors(mirrors, claims):
                ignore_not_found(self.up.delete_persistent_volume, stale)

    def _reflect_events(self) -> None:
        """Events about pods' copies, as Events on the tenant pods: only for pods placed here (a cluster a pod
        has left pushes nothing up), once per change of each source Event."""
        with self._lock:
            events, self._events = list(self._events.values()), OrderedDict()
        for event in events:
            involved = event.get("involvedObject") or {}
            copy_ns = self._copy_namespaces.get(involved.get("namespace") or "")
            tenant_ns = _labels(copy_ns).get(LABEL_TENANT_NAMESPACE) if copy_ns is not None else None
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

    def _sync_pod(self, tenant_ns: str, target: str, name: str) -> None:
        pod = self._sources[POD].get((tenant_ns, name))
        copy = self._copies[POD].get((target, name))
        if pod is None:
            self._delete_copy(copy)
            return
        annotations = _annotations(pod)
        if copy_stays_here(annotations.get(MOVED_FROM_ANNOTATION), self.cluster, pooling=self.pooling):
            if _deleting(pod):
                self._delete_copy(copy)
            return  # moved away: its copy stays, silent, until the move ends
        if not pod_goes_here(annotations.get(POD_CLUSTER_ANNOTATION), self.cluster, pooling=self.pooling):
            self._delete_copy(copy)
        elif _deleting(pod):
            if copy is not None:
                self._delete_copy(copy)
            else:
                ignore_not_found(self.up.delete_namespaced_pod, name, tenant_ns, grace_period_seconds=0)
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

    def _delete_copy(self, copy: Obj | None) -> None:
        if copy is not None and not _deleting(copy):
            ignore_not_found(self.down.delete_namespaced_pod, copy["metadata"]["name"], copy["metadata"]["namespace"])

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
        copy owns its status now), the write is refused, and the move's event queues the pod again."""
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
