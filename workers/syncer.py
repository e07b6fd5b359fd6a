"""The pool's syncer, one per super cluster, for every Tenant of the pool: `python -m workers.syncer`. It follows
the Tenants in the pool's management cluster (kube/tenants.py: each with a client for its control plane, from
its kubeconfig Secret) and copies every object of each tenant's namespaces placed on its cluster down (the
namespace itself, named by models/names.py super_cluster_namespace, and the kinds of models/pool/sync.py:
SYNCED_KINDS), only the pods placed on its cluster, and status back up: pod status, and, when its cluster is
the namespace's status cluster, LoadBalancer addresses and PVC binding; Events about the pods' copies become
Events on the tenant pods. A namespace whose placement no longer names this cluster, and that no longer
drains from it, is deleted here; a pod moved away keeps its copy here, silent, until its move ends
(models/pool/moves.py). Behind the feature gate SuperClusterPooling; with the gate off it syncs everything,
as virtualcluster's syncer does without a pool.

What it makes carries the tenant's and the tenant namespace's labels (copy_labels), and it touches and
deletes only what carries them; a tenant whose control plane has not listed (unreachable, no usable
kubeconfig) is not touched at all, so its copies keep running. It holds a finalizer on each Tenant it
serves (tenant_finalizer), released once the Tenant is being removed and nothing of it is left here.

Level-triggered, as the virtual kubelet's reflection (kube/workqueue.py): informers keep both sides in
Stores (per tenant, its namespaces, pods, synced kinds and mirrored volumes; the super cluster's namespaces
and copies), every change of either side queues the key (tenant, tenant namespace, kind, name) of what it
concerns, and the handler reads both sides of that one object from the Stores and writes what differs. The
queue takes one key of each tenant in turn, so one tenant's burst does not hold another's pods back. A
change of a namespace queues everything in it; every RESYNC_SECONDS everything is queued again from the
Stores (no list call), a safety net for a write the API server took but whose event never came. A copy
whose source digest is unchanged costs no write.

Tenant pods look like pods (workers/tenant_nodes.py): a pod whose copy is scheduled here is bound, in its
tenant's control plane, to a virtual node standing for the copy's node, and a kubelet API per tenant serves
its logs, exec and port-forward."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from kube.clients import client_from_own_kubeconfig_file
from kube.clock import utcnow
from kube.errors import already_exists
from kube.informer import Informer, Store
from kube.objects import APPLY, drained, ignore_not_found, raw_json, read_cluster_object, record_event
from kube.process import wait_for_termination
from kube.recent import SharedRecent
from kube.tenants import TenantConnection, TenantRegistry
from kube.workqueue import WorkQueue
from models.api import SuperCluster
from models.api.conditions import Reason
from models.enforcement import status_message
from models.names import (
    API_VERSION,
    FEATURE_SUPER_CLUSTER_POOLING,
    GROUP,
    KUBELET_PORT,
    LABEL_MANAGED_BY,
    LABEL_SUPER_CLUSTER,
    LABEL_TENANT,
    LABEL_TENANT_NAMESPACE,
    MANAGED_BY,
    MOVED_FROM_ANNOTATION,
    POD_CLUSTER_ANNOTATION,
    SUPER_CLUSTERS,
    TENANTS,
    VERSION,
    super_cluster_namespace,
    tenant_finalizer,
)
from models.pods import (
    MAX_REMEMBERED_EVENTS,
    ReflectedEvents,
    copied_status,
    event_for_origin,
    said_by_the_pool,
    says,
    status_patch,
    status_shape,
)
from models.pool.isolation import QuotaShare, SuperClusterSettings, slices_held_here
from models.pool.moves import (
    draining_of,
    refused_status,
    scheduled_of,
)
from models.pool.namespaces import OUTSIDE_SYSTEM_NAMESPACES, SYSTEM_NAMESPACES, placement_of
from models.pool.sync import (
    API_VERSIONS,
    SYNCED_KINDS,
    EndpointGuard,
    copy_for_super,
    copy_stays_here,
    endpoints_of,
    in_scope,
    ingress_hosts,
    is_copy,
    load_balancer_status,
    mirror_volume,
    pod_for_super,
    pod_goes_here,
    refused_endpoints,
    selectorless_services,
    stale_mirrors,
    status_cluster,
    super_namespace_labels,
    taken_hosts,
    unchanged,
)
from models.pool.tenancy import recorded_placement, trusted_annotations
from models.times import format_rfc3339
from workers.tenant_nodes import TenantNodes

log = logging.getLogger("tidepool.syncer")
RESYNC_SECONDS = 300
# Handlers at once: each is a few API calls of one object, mostly waiting on an API server; a burst of a
# tenant's pods is copied as fast as a client creating them directly with as many connections.
WORKERS = 16
FIELD_MANAGER = "tidepool-syncer"
Obj = dict[str, Any]
# Refusals of a pod's copy that pass: its namespace's quota copy not raised yet for slices that just came, or
# its namespace's old copy still terminating. Retried after a backoff, never told to the tenant as refused.
PASSING_REFUSALS = ("exceeded quota", "is being terminated")
# Refusals told to tenants, remembered so that none is told twice: bounded, the oldest forgotten first.
MAX_REMEMBERED_REFUSALS = 10_000
# This syncer's writes whose watch events may not be in yet (status pushes, by the resourceVersion pushed onto;
# copies made): the newest kept, far more than a burst's writes in flight.
MAX_REMEMBERED_WRITES = 10_000
# A copy made counts as there for this long without its watch event; after, it is read (a watch lagging behind
# a burst) and created again only if it is not there.
COPY_MADE_SECONDS = 30.0
# Refused endpoint addresses named in one Event; the rest are counted.
MAX_SAID_ADDRESSES = 5
# How long an Ingress copy this syncer applied counts as holding its hosts before its watch event is in.
INGRESS_CLAIM_SECONDS = 30.0
Key = tuple[str, str, str, str]  # (tenant, tenant namespace, kind, name)
NAMESPACE, POD, TENANT = "Namespace", "Pod", "Tenant"
EVENTS: Key = ("", "", "Event", "")  # the Events seen since the last reflection
Named = tuple[str, str]  # (namespace, name), of either side


def _named(obj: Obj) -> Named:
    return obj["metadata"].get("namespace") or "", obj["metadata"]["name"]


def _trimmed(obj: Obj) -> Obj:
    obj.get("metadata", {}).pop("managedFields", None)  # the bulk of most objects, and read by nobody here
    return obj


def _tenant_pod_kept(pod: Obj, *, cluster: str, pooling: bool, copied: Callable[[str, str], bool]) -> Obj:
    """A tenant pod as this cluster's syncer keeps it. Placed here or moving away from here: whole until its copy
    exists (`copied(namespace, name)`), then without the spec but what reading the copy's status takes
    (_spec_left_out: a spec is half a pod, and the copy holds it); a copy that goes is made again from the pod
    read anew. Otherwise who it is, its placement and the node it is bound to (a virtual node of this cluster
    outlives a pod's move: workers/tenant_nodes.py), so that a pool of N super clusters keeps each spec once,
    not N times. The event that places a pod here carries it whole."""
    kept = _trimmed(pod)
    annotations = _annotations(kept)
    if pod_goes_here(annotations.get(POD_CLUSTER_ANNOTATION), cluster, pooling=pooling) or copy_stays_here(
            annotations.get(MOVED_FROM_ANNOTATION), cluster, pooling=pooling):  # fmt: skip
        meta = kept.get("metadata") or {}
        return _spec_left_out(kept) if copied(meta.get("namespace") or "", meta.get("name") or "") else kept
    meta = kept.get("metadata") or {}
    # No resourceVersion: another cluster's status pushes on it then change nothing kept, and wake nothing here.
    # Of its annotations, the pool's two placement ones: a tenant's own are up to 256 KiB a pod, held N times.
    placement = {k: v for k, v in annotations.items() if k in (POD_CLUSTER_ANNOTATION, MOVED_FROM_ANNOTATION)}
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "uid", "deletionTimestamp") if k in meta}
                        | {"annotations": placement},
            "spec": {"nodeName": (kept.get("spec") or {}).get("nodeName")}}  # fmt: skip


# Keys no API object has: a tenant pod kept without its spec; a status kept as its JSON text; a copy's pod IP
# beside it (every endpoint guard reads every copy's: unpacking each status there would cost a parse a copy).
SPEC_LEFT_OUT = "tidepool:specLeftOut"
PACKED_STATUS = "tidepool:statusJson"
POD_IP = "tidepool:podIP"


def _spec_left_out(pod: Obj) -> Obj:
    """A pod without its spec, but its node and what the status read from its copy is shaped by
    (models/pods.py status_shape); its status packed."""
    spec = pod.get("spec") or {}
    pod["spec"] = {"nodeName": spec.get("nodeName"), "readinessGates": spec.get("readinessGates") or [],
                   **{key: [{"name": c.get("name")} for c in spec.get(key) or [] if isinstance(c, dict)]
                      for key in ("containers", "initContainers")}}  # fmt: skip
    pod[SPEC_LEFT_OUT] = True
    return _packed(pod)


def _packed(pod: Obj) -> Obj:
    """A pod whose status is kept as its JSON text: a third of the parsed dicts and lists (a status is most of
    a pod, and read only when one is pushed); _status reads it."""
    pod[PACKED_STATUS] = json.dumps(pod.pop("status", None) or {}, separators=(",", ":"))
    return pod


def _status(pod: Obj) -> dict[str, Any]:
    packed = pod.get(PACKED_STATUS)
    found = json.loads(packed) if packed is not None else pod.get("status")
    return found if isinstance(found, dict) else {}


def _copy_kept(pod: Obj) -> Obj:
    """Of a pod's copy, what the syncer reads: who it is (of its labels, whose copy: the tenant's own are on
    the tenant's pod), where it runs and its status (its spec is the tenant pod's, held on that side already)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    return _packed({"metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")
                                 if k in meta}
                                | {"labels": {k: labels[k] for k in (LABEL_MANAGED_BY, LABEL_TENANT, LABEL_TENANT_NAMESPACE)
                                              if k in labels}},
                    "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")}, "status": pod.get("status"),
                    POD_IP: (pod.get("status") or {}).get("podIP")})  # fmt: skip


def _labels(obj: Obj) -> dict[str, str]:
    return obj.get("metadata", {}).get("labels") or {}


def _annotations(obj: Obj) -> dict[str, str]:
    return obj.get("metadata", {}).get("annotations") or {}


def _deleting(obj: Obj) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


class _TenantSide:
    """One tenant's control plane as a syncer follows it: its namespaces, pods and synced kinds in Stores, fed
    by informers on the client its Tenant's kubeconfig gives. Replaced whole when that client changes (a
    rotated kubeconfig): the new side's keys are handled once it has listed, the old one's never again."""

    def __init__(self, syncer: Syncer, connection: TenantConnection) -> None:
        assert connection.api is not None
        self.name, self.api = connection.name, connection.api
        self.up, self.apis = k8s.CoreV1Api(connection.api), _KindApis(connection.api)
        self._stop = threading.Event()
        self._synced = threading.Event()
        queue, tenant = syncer.queue, connection.name
        self.namespaces: Store[str, Obj] = Store(lambda o: o["metadata"]["name"],
                                                 lambda name, _old, _new: queue.add((tenant, name, NAMESPACE, "")))
        self.sources: dict[str, Store[Named, Obj]] = {kind: Store(_named, _queues(queue, tenant, kind))
                                                      for kind in (POD, *SYNCED_KINDS)}  # fmt: skip
        # The PersistentVolumes this super cluster's syncer mirrored into the tenant (mirror_volume): read from
        # here, so that a resync lists nothing.
        self.mirrors: Store[str, Obj] = Store(lambda o: o["metadata"]["name"], lambda *_: None)
        mirrored = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_SUPER_CLUSTER}={syncer.cluster}"
        prefix = f"syncer-{syncer.cluster}-{tenant}"
        self._informers = [
            _informer(f"{prefix}-namespaces", self.namespaces, self.up.list_namespace),
            _informer(f"{prefix}-mirrors", self.mirrors, self.up.list_persistent_volume, label_selector=mirrored),
            _informer(f"{prefix}-pods", self.sources[POD], self.up.list_pod_for_all_namespaces,
                      field_selector=OUTSIDE_SYSTEM_NAMESPACES,
                      transform=partial(_tenant_pod_kept, cluster=syncer.cluster, pooling=syncer.pooling,
                                        copied=partial(syncer.has_copy, tenant))),
            *(_informer(f"{prefix}-{kind.lower()}", self.sources[kind], self.apis.list_all(kind),
                        field_selector=OUTSIDE_SYSTEM_NAMESPACES) for kind in SYNCED_KINDS),
        ]  # fmt: skip
        self._thread = threading.Thread(target=self._wait_listed, args=(syncer,), name=prefix, daemon=True)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def start(self) -> _TenantSide:
        for informer in self._informers:
            informer.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for informer in self._informers:
            informer.stop()

    def _wait_listed(self, syncer: Syncer) -> None:
        """Once every kind is listed (an unreachable control plane never is: nothing of it is touched), all
        of the tenant's keys are handled."""
        for informer in self._informers:
            while not informer.wait_synced(1):
                if self._stop.is_set():
                    return
        self._synced.set()
        syncer.queue.add_all(list(syncer.everything_of(self.name)))

    def read_pod(self, namespace: str, name: str) -> Obj | None:
        """A pod read whole from the tenant's API server, as its informer would keep it; None if gone."""
        try:
            return _trimmed(raw_json(self.up.read_namespaced_pod(name, namespace, _preload_content=False)))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def everything(self) -> Iterator[Key]:
        yield from ((self.name, name, NAMESPACE, "") for name in self.namespaces.keys())
        for kind, store in self.sources.items():
            yield from ((self.name, namespace, kind, name) for namespace, name in store.keys())


def _queues(queue: WorkQueue[Key], tenant: str, kind: str) -> Callable[[Named, Obj | None, Obj | None], None]:
    def changed(key: Named, _old: Obj | None, _new: Obj | None) -> None:
        queue.add((tenant, key[0], kind, key[1]))

    return changed


def _informer(name: str, store: Store[Any, Obj], list_call: Callable[..., Any], *,
              transform: Callable[[Obj], Obj] = _trimmed, **kwargs: Any) -> Informer[Obj]:  # fmt: skip
    return Informer(name, list_call, on_sync=store.sync, on_event=store.event, transform=transform, **kwargs)


def _records_changed(old: Obj | None, new: Obj | None) -> set[str]:
    """The namespaces whose record differs between two versions of a Tenant."""
    before = ((old or {}).get("status") or {}).get("placements") or {}
    after = ((new or {}).get("status") or {}).get("placements") or {}
    return {ns for ns in before.keys() | after.keys() if before.get(ns) != after.get(ns)}


def _origin(obj: Obj) -> tuple[str, str] | None:
    """The (tenant, tenant namespace) a super cluster's copy was made for, from its labels; None for what no
    syncer made."""
    labels = _labels(obj)
    tenant, namespace = labels.get(LABEL_TENANT), labels.get(LABEL_TENANT_NAMESPACE)
    return (tenant, namespace) if tenant and namespace and labels.get(LABEL_MANAGED_BY) == MANAGED_BY else None


class Syncer:
    """One per super cluster, for every Tenant of the pool: the Tenants and their kubeconfigs come from the
    pool's management cluster (kube/tenants.py), each tenant's control plane is followed by a _TenantSide,
    and the super cluster's copies by one set of informers, each copy routed to its tenant by its labels."""

    def __init__(self, *, management: k8s.ApiClient, super_cluster: k8s.ApiClient, cluster: str,
                 pooling: bool = True, settings: SuperClusterSettings = SuperClusterSettings(),
                 kubelet_address: str = "127.0.0.1", kubelet_port: int = 0) -> None:  # fmt: skip
        """`kubelet_address`, `kubelet_port`: where tenants' API servers reach this syncer's kubelet API (their
        nodes' InternalIP and kubelet port, one for every tenant; port 0: a free one)."""
        self.cluster, self.pooling, self.settings = cluster, pooling, settings
        self.down = k8s.CoreV1Api(super_cluster)
        self._tenant_objects = k8s.CustomObjectsApi(management)
        self._super = _KindApis(super_cluster)
        self.queue: WorkQueue[Key] = WorkQueue(f"syncer-{cluster}", self._handle, workers=WORKERS,
                                                owner=_tenant_of)  # one tenant's burst holds no other back
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sides: dict[str, _TenantSide] = {}
        # Source Events to reflect, by uid: a burst beyond it keeps the newest, the super cluster aggregates others.
        self._events: SharedRecent[str, dict[str, Any]] = SharedRecent(MAX_REMEMBERED_EVENTS)
        self._reflected = ReflectedEvents()
        # (tenant, pod uid) -> why its copy was refused, as told.
        self._refusals_told: SharedRecent[tuple[str, str], str] = SharedRecent(MAX_REMEMBERED_REFUSALS)
        # (tenant, pod uid) -> the resourceVersion its last status push was written onto, until the store moves on.
        self._pushed_onto: SharedRecent[tuple[str, str], str] = SharedRecent(MAX_REMEMBERED_WRITES)
        # (super namespace, name) -> when (monotonic) this syncer made that pod copy, until its store shows it:
        # a second create would be refused as existing, after the super cluster's quota admission charged it
        # (the charge stays until its quota controller's next full count, minutes later: copies refused meanwhile).
        self._copies_made: SharedRecent[Named, float] = SharedRecent(MAX_REMEMBERED_WRITES)
        self._ingress_lock = threading.Lock()
        # (tenant, host) -> when (monotonic) this process applied an Ingress copy holding it, for a while.
        self._ingress_applied: dict[tuple[str, str], float] = {}
        # (tenant, namespace, kind/name, message) of what of a tenant's object was not copied, as told.
        self._objects_told: SharedRecent[tuple[str, str, str, str], None] = SharedRecent(MAX_REMEMBERED_REFUSALS)
        self.registry = TenantRegistry(management, name=f"syncer-{cluster}", changed=self._tenant_changed,
                                       tenant_object_changed=self._tenant_object_changed)  # fmt: skip
        # The copies, by (super namespace, name).
        self._copy_namespaces: Store[str, Obj] = Store(lambda o: o["metadata"]["name"], self._copy_namespace_changed)
        self._copies: dict[str, Store[Named, Obj]] = {
            kind: Store(_named, self._copy_changed(kind)) for kind in (POD, *SYNCED_KINDS)}
        made = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_TENANT},{LABEL_TENANT_NAMESPACE}"
        prefix = f"syncer-{cluster}-super"
        self._informers = [
            _informer(f"{prefix}-namespaces", self._copy_namespaces, self.down.list_namespace, label_selector=made),
            _informer(f"{prefix}-pods", self._copies[POD], self.down.list_pod_for_all_namespaces, label_selector=made,
                      transform=_copy_kept),
            *(_informer(f"{prefix}-{kind.lower()}", self._copies[kind], self._super.list_all(kind), label_selector=made)
              for kind in SYNCED_KINDS),
            Informer(f"{prefix}-events", self.down.list_event_for_all_namespaces,
                     field_selector="involvedObject.kind=Pod", on_sync=self._events_listed, on_event=self._event_seen),
        ]  # fmt: skip
        self._thread = threading.Thread(target=self._resync_loop, name=f"syncer-{cluster}", daemon=True)
        self.nodes = TenantNodes(super_cluster=super_cluster, cluster=cluster, address=kubelet_address,
                                 kubelet_port=kubelet_port,
                                 copies_of=self._pod_copies_of)  # fmt: skip

    def has_copy(self, tenant: str, tenant_ns: str, name: str) -> bool:
        """Whether a tenant pod's copy is here (as this syncer last saw)."""
        return self._copies[POD].get((super_cluster_namespace(tenant, tenant_ns), name)) is not None

    def _pod_copies_of(self, tenant: str) -> list[Obj]:
        return [copy for copy in self._copies[POD].values() if (_origin(copy) or ("",))[0] == tenant]

    def _copy_changed(self, kind: str) -> Callable[[Named, Obj | None, Obj | None], None]:
        def changed(key: Named, old: Obj | None, new: Obj | None) -> None:
            if kind == POD:
                self._copies_made.pop(key)  # the store knows of it from here on
            if origin := _origin(new or old or {}):
                self.queue.add((*origin, kind, key[1]))

        return changed

    def _copy_namespace_changed(self, _name: str, old: Obj | None, new: Obj | None) -> None:
        if origin := _origin(new or old or {}):
            self.queue.add((*origin, NAMESPACE, ""))
            self.queue.add((origin[0], "", TENANT, ""))  # a removed tenant's last namespace gone lets it go

    def _events_listed(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            self._event_seen("ADDED", event)

    def _event_seen(self, kind: str, event: dict[str, Any]) -> None:
        if kind == "DELETED":
            return
        self._events.put(event["metadata"]["uid"], event)
        self.queue.add(EVENTS)

    def _tenant_object_changed(self, tenant: str, old: Obj | None, new: Obj | None) -> None:
        """The pool wrote its records of the tenant's namespaces: each one that changed is looked at again."""
        self.queue.add_all([(tenant, namespace, NAMESPACE, "") for namespace in sorted(_records_changed(old, new))])

    def _tenant_changed(self, tenant: str) -> None:
        """The registry's word on one Tenant: its side started, replaced (a new kubeconfig) or stopped (no
        usable kubeconfig, or removed). A stopped side's copies stay as they are, until it is served again or
        its Tenant is removed."""
        connection = self.registry.get(tenant)
        with self._lock:
            side = self._sides.get(tenant)
            if side is not None and (connection is None or not connection.served or connection.api is not side.api):
                side.stop()
                self.nodes.unfollow(tenant)
                del self._sides[tenant]
                side = None
            if side is None and connection is not None and connection.served and not self._stop.is_set():
                self._sides[tenant] = side = _TenantSide(self, connection).start()
                self.nodes.follow(tenant, side.api, side.sources[POD])
        self.queue.add((tenant, "", TENANT, ""))

    def start(self) -> Syncer:
        self.nodes.start()
        self.registry.start()
        for informer in self._informers:
            informer.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.registry.stop()
        for informer in self._informers:
            informer.stop()
        with self._lock:
            for side in self._sides.values():
                side.stop()
        self.queue.stop()
        self.nodes.stop()
        self._thread.join(timeout=10)

    def _resync_loop(self) -> None:
        """Handlers start once the copies, the Tenants and the super cluster's networks are listed (a copy seen
        before its tenant's side has listed is left alone: see _handle), then everything is queued again every
        RESYNC_SECONDS."""
        listed: list[Callable[[float], bool]] = [*(i.wait_synced for i in self._informers), self.registry.wait_synced,
                                                 self.nodes.networks_listed]  # what the endpoint guard reads
        for wait_synced in listed:
            while not wait_synced(1):
                if self._stop.is_set():
                    return
        self.queue.start()
        while True:
            self.queue.add_all(list(self._everything()))
            if self._stop.wait(RESYNC_SECONDS):
                return

    def use_settings(self, settings: SuperClusterSettings) -> None:
        """Its SuperCluster changed: every namespace is labelled at the new level, and new copies of pods
        get the new priority rules (a running pod's spec cannot change: it keeps its class)."""
        if settings != self.settings:
            log.info("syncer %s: settings %s", self.cluster, settings)
            self.settings = settings
            self.queue.add_all(list(self._everything()))

    def _side(self, tenant: str) -> _TenantSide | None:
        """The tenant's side, once it has listed: the only state its keys are handled from."""
        with self._lock:
            side = self._sides.get(tenant)
        return side if side is not None and side.synced else None

    def everything_of(self, tenant: str) -> Iterator[Key]:
        side = self._side(tenant)
        if side is not None:
            yield from side.everything()
        for origin in {o for copy in self._copy_namespaces.values() if (o := _origin(copy)) and o[0] == tenant}:
            yield (*origin, NAMESPACE, "")
        for kind, store in self._copies.items():
            yield from ((*o, kind, copy["metadata"]["name"]) for copy in store.values()
                        if (o := _origin(copy)) and o[0] == tenant)  # fmt: skip
        yield tenant, "", TENANT, ""

    def _everything(self) -> Iterator[Key]:
        tenants = {c.name for c in self.registry.connections()}
        tenants |= {origin[0] for copy in self._copy_namespaces.values() if (origin := _origin(copy))}
        for tenant in sorted(tenants):
            yield from self.everything_of(tenant)
        yield EVENTS

    def _in(self, side: _TenantSide, tenant_ns: str, target: str) -> Iterator[Key]:
        """Every object of a tenant namespace and of its copy."""
        for kind in (POD, *SYNCED_KINDS):
            yield from ((side.name, tenant_ns, kind, name) for namespace, name in side.sources[kind].keys()
                        if namespace == tenant_ns)  # fmt: skip
            yield from ((side.name, tenant_ns, kind, name) for namespace, name in self._copies[kind].keys()
                        if namespace == target)  # fmt: skip

    def _handle(self, key: Key) -> None:
        tenant, tenant_ns, kind, name = key
        if key == EVENTS:
            self._reflect_events()
            return
        if kind == TENANT:
            self._sync_tenant(tenant)
            return
        side = self._side(tenant)
        if side is None:
            return  # not followed (unreachable, no kubeconfig, removed): nothing of it is touched here
        target = self._target(side, tenant_ns)
        if kind == NAMESPACE:
            self._sync_namespace(side, tenant_ns, target)
        elif target is None:
            return  # its copy goes with the copy of its namespace
        elif kind == POD:
            self._sync_pod(side, tenant_ns, target, name)
        else:
            self._sync_copy(side, kind, tenant_ns, target, name)

    def _sync_tenant(self, tenant: str) -> None:
        """This cluster's finalizer on the Tenant: held while the tenant is served, and, once its Tenant is
        being removed, released only after every namespace made here for it is gone."""
        connection = self.registry.get(tenant)
        if connection is None:
            return  # no Tenant: what carries its label here was not made by this pool's syncers for one
        mine = tenant_finalizer(self.cluster)
        if not connection.deleting:
            if connection.served and mine not in connection.finalizers:
                self._finalizer(tenant, hold=True)
            return
        left = [copy for copy in self._copy_namespaces.values() if (_origin(copy) or ("",))[0] == tenant]
        for copy in left:
            if not _deleting(copy):
                log.info("syncer %s: tenant %s is removed, deleting %s", self.cluster, tenant, copy["metadata"]["name"])
                ignore_not_found(self.down.delete_namespace, copy["metadata"]["name"])
        if not left and mine in connection.finalizers and not self._any_left(tenant):
            if connection.api is not None:
                self.nodes.remove(tenant, connection.api)  # its virtual nodes of this cluster, before it may go
            self._finalizer(tenant, hold=False)
            log.info("syncer %s: tenant %s is removed: nothing of it is left here", self.cluster, tenant)

    def _any_left(self, tenant: str) -> bool:
        """Asked of the API server, not the Store: a namespace created a moment ago may not have reached the
        Store yet, and a finalizer released past it would leave it behind. Only while a Tenant goes."""
        made = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_TENANT}={tenant}"
        return bool(self.down.list_namespace(label_selector=made, limit=1).items)

    def _finalizer(self, tenant: str, *, hold: bool) -> None:
        """Server-side apply of this syncer's one finalizer: finalizers are a set, each entry owned by its
        applier, so the other syncers' entries are neither read nor written."""
        body = {"apiVersion": API_VERSION, "kind": "Tenant",
                "metadata": {"name": tenant, "finalizers": [tenant_finalizer(self.cluster)] if hold else []}}  # fmt: skip
        try:
            self._tenant_objects.patch_cluster_custom_object(GROUP, VERSION, TENANTS, tenant, body,
                                                             field_manager=f"{FIELD_MANAGER}-{self.cluster}",
                                                             _content_type=APPLY)  # fmt: skip
        except ApiException as e:
            # A release to a Tenant gone is done: an apply there would create one, refused without a spec (422). A
            # hold refused (gone, or being deleted: no finalizer may be added then) must stop what would follow it.
            if hold or e.status not in (404, 422):
                raise

    def _placement_view(self, side: _TenantSide, tenant_ns: str, ns: Obj) -> dict[str, str]:
        """The namespace's annotations with its placement as the pool recorded it in the Tenant's status (which
        the tenant cannot write), never as the namespace says: a tenant writing its own placement annotations
        gets nothing copied beyond what the scheduler placed."""
        return trusted_annotations(_annotations(ns), recorded_placement(self.registry.tenant_object(side.name), tenant_ns),
                                   edits=False)  # fmt: skip

    def _target(self, side: _TenantSide, tenant_ns: str) -> str | None:
        """The namespace's copy here, if it is placed here."""
        ns = side.namespaces.get(tenant_ns)
        if ns is None or tenant_ns in SYSTEM_NAMESPACES or tenant_ns.startswith("kube-") or _deleting(ns):
            return None
        annotations = self._placement_view(side, tenant_ns, ns)
        if not in_scope(placement_of(annotations), self.cluster, pooling=self.pooling,
                        scheduled=scheduled_of(annotations), draining=draining_of(annotations)):  # fmt: skip
            return None
        return super_cluster_namespace(side.name, tenant_ns)

    def _sync_namespace(self, side: _TenantSide, tenant_ns: str, target: str | None) -> None:
        if target is None:
            for left in self._copy_namespaces.values():
                if _origin(left) == (side.name, tenant_ns) and not _deleting(left):
                    log.info("syncer %s: %s/%s left the placement, deleting %s", self.cluster, side.name, tenant_ns,
                             left["metadata"]["name"])  # fmt: skip
                    ignore_not_found(self.down.delete_namespace, left["metadata"]["name"])
            return
        labels = super_namespace_labels(side.name, tenant_ns, settings=self.settings)
        copy = self._copy_namespaces.get(target)
        if copy is None:
            self._create_namespace(side.name, target, labels)
        elif _origin(copy) != (side.name, tenant_ns):
            raise NotOurs(f"namespace {target} is {_origin(copy)}'s, not {(side.name, tenant_ns)}'s: left as it is")
        elif _deleting(copy):
            return  # its DELETED event queues the namespace again, to be made anew
        elif labels.items() - _labels(copy).items():
            self.down.patch_namespace(target, {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": target, "labels": labels}},
                                      field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)  # fmt: skip
        # Its placement may have changed what goes here: everything in it is looked at again.
        self.queue.add_all(list(self._in(side, tenant_ns, target)))

    def _create_namespace(self, tenant: str, target: str, labels: dict[str, str]) -> None:
        """Made only once this syncer's finalizer holds the Tenant (so that removing it waits for this cluster),
        and never over a namespace of the same name that is not this tenant namespace's copy: a create, not an
        apply, which would adopt whatever namespace had that name."""
        connection = self.registry.get(tenant)
        if connection is None or not connection.served:
            return  # removed (or no longer served) meanwhile: nothing more is made for it
        if tenant_finalizer(self.cluster) not in connection.finalizers:
            self._finalizer(tenant, hold=True)
        try:
            self.down.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": target, "labels": labels}}),
                                       field_manager=FIELD_MANAGER)  # fmt: skip
        except ApiException as e:
            if not already_exists(e):
                raise
            found = self.down.read_namespace(target)
            if _origin({"metadata": {"labels": found.metadata.labels if found.metadata else None}}) != \
                    (tenant, labels[LABEL_TENANT_NAMESPACE]):  # fmt: skip
                raise NotOurs(f"namespace {target} exists in super cluster {self.cluster} and is not the copy of "
                              f"{tenant}'s namespace {labels[LABEL_TENANT_NAMESPACE]}: left as it is") from None

    def _sync_copy(self, side: _TenantSide, kind: str, tenant_ns: str, target: str, name: str) -> None:
        """One object of a synced kind down, then, for Services and claims, its status up."""
        source = side.sources[kind].get((tenant_ns, name))
        copy = self._copies[kind].get((target, name))
        if copy is not None and not is_copy(kind, copy):
            copy = None  # the super cluster's own (endpoints it derived): never deleted, overwritten by a copy
        body: Obj | None = None
        if source is not None:
            selectorless = self._selectorless(side, tenant_ns, endpoints_of(kind, source))
            guard = self._endpoint_guard(target) if selectorless else None
            body = copy_for_super(kind, source, tenant=side.name, target_namespace=target, tenant_namespace=tenant_ns,
                                  selectorless_services=selectorless, endpoints=guard,
                                  quota=self._quota_share(side, tenant_ns) if kind == "ResourceQuota" else None)  # fmt: skip
            if body is not None and guard is not None and (refused := refused_endpoints(kind, source, guard)):
                self._tell_endpoints_refused(side, tenant_ns, kind, source, refused)
        if body is not None and kind == "Ingress":
            self._sync_ingress(side, tenant_ns, target, source or {}, copy, body)
        elif body is not None:
            if not unchanged(copy, body):
                self._super.apply(kind, target, body)
        elif copy is not None:
            self._super.delete(kind, target, name)
        if kind == "Service":  # whether its endpoints are copied follows from its selector
            self.queue.add((side.name, tenant_ns, "Endpoints", name))
            self.queue.add_all([(side.name, tenant_ns, "EndpointSlice", found)
                                for found in self._slices(side, tenant_ns, target, name)])  # fmt: skip
        if kind in ("Service", "PersistentVolumeClaim") and self._shows_status(side, tenant_ns):
            self._status_up(side, kind, tenant_ns, source, copy)

    def _sync_ingress(self, side: _TenantSide, tenant_ns: str, target: str, source: Obj, copy: Obj | None,
                      body: Obj) -> None:  # fmt: skip
        """An Ingress goes down only with hosts no other tenant's copy holds here (the first keeps a host); one
        that asks for a taken host is not copied, or its copy stays as it was, and the tenant is told once.
        Checked and applied under one lock, with this process's recent applies counted until its store has
        them, so that two tenants asking at once never both get a host."""
        hosts = ingress_hosts(body)
        with self._ingress_lock:
            now = time.monotonic()
            self._ingress_applied = {k: at for k, at in self._ingress_applied.items() if now - at < INGRESS_CLAIM_SECONDS}
            claims = {host: owner for owner, host in self._ingress_applied}
            for held in self._copies["Ingress"].values():
                owner = _labels(held).get(LABEL_TENANT)
                if owner and held is not copy:
                    claims.update(dict.fromkeys(ingress_hosts(held), owner))
            taken = taken_hosts(hosts, tenant=side.name, claims=claims)
            if not taken:
                if not unchanged(copy, body):
                    self._super.apply("Ingress", target, body)
                    self._ingress_applied.update(dict.fromkeys(((side.name, host) for host in hosts), now))
                return
        said = ", ".join(f"{host} (held by another tenant)" for host in sorted(taken))
        self._tell_once(side, tenant_ns, "Ingress", source, "IngressHostTaken",
                        f"not copied to super cluster {self.cluster}: {said}")  # fmt: skip

    def _tell_once(self, side: _TenantSide, tenant_ns: str, kind: str, source: Obj, reason: Reason,
                   message: str) -> None:  # fmt: skip
        """A Warning on a tenant's object about what of it was not copied: once per message (bounded), not at
        every pass."""
        told = (side.name, tenant_ns, f"{kind}/{source.get('metadata', {}).get('name') or ''}", message)
        if not self._objects_told.add(told, None):
            return
        record_event(side.api, {"apiVersion": API_VERSIONS[kind], "kind": kind, "metadata": source.get("metadata") or {}},
                     reason=reason, message=message, warning=True)  # fmt: skip

    def _endpoint_guard(self, target: str) -> EndpointGuard:
        """What a tenant's own endpoints in super namespace `target` may name: the super cluster's networks
        and every other namespace's pods are out of bounds; the pods of `target` itself are its own."""
        own: list[str] = []
        others: list[str] = []
        for pod in self._copies[POD].values():
            if ip := pod.get(POD_IP):
                (own if _named(pod)[0] == target else others).append(str(ip))
        return EndpointGuard.of(networks=self.nodes.networks(), own=own, others=others)

    def _tell_endpoints_refused(self, side: _TenantSide, tenant_ns: str, kind: str, source: Obj,
                                refused: list[str]) -> None:  # fmt: skip
        said = ", ".join(refused[:MAX_SAID_ADDRESSES]) + (f" and {len(refused) - MAX_SAID_ADDRESSES} more"
                                                           if len(refused) > MAX_SAID_ADDRESSES else "")  # fmt: skip
        self._tell_once(side, tenant_ns, kind, source, "EndpointRefused",
                        f"not copied to super cluster {self.cluster}: {said} (its pod, node or Service networks, "
                        "not this namespace's pods)")  # fmt: skip

    def _quota_share(self, side: _TenantSide, tenant_ns: str) -> QuotaShare | None:
        """The share of the namespace's quota this cluster holds; without the gate, all of it. Its placement
        changing re-queues the namespace's quotas (_sync_namespace), whose copies then take the new share."""
        ns = side.namespaces.get(tenant_ns)
        if not self.pooling or ns is None:
            return None
        return slices_held_here(self._placement_view(side, tenant_ns, ns), self.cluster)

    def _selectorless(self, side: _TenantSide, tenant_ns: str, service: str | None) -> frozenset[str]:
        """The endpoints' Service, if it has no selector (its owner writes its endpoints, which are copied)."""
        found = side.sources["Service"].get((tenant_ns, service)) if service else None
        return selectorless_services([found]) if found is not None else frozenset()

    def _slices(self, side: _TenantSide, tenant_ns: str, target: str, service: str) -> set[str]:
        """The EndpointSlices of a Service, on either side."""
        both = [*(o for o in side.sources["EndpointSlice"].values() if _named(o)[0] == tenant_ns),
                *(o for o in self._copies["EndpointSlice"].values() if _named(o)[0] == target)]  # fmt: skip
        return {o["metadata"]["name"] for o in both if endpoints_of("EndpointSlice", o) == service}

    def _shows_status(self, side: _TenantSide, tenant_ns: str) -> bool:
        """This cluster is the namespace's status cluster (models/pool/sync.py: status_cluster)."""
        if not self.pooling:
            return True
        ns = side.namespaces.get(tenant_ns)
        return ns is not None and status_cluster(placement_of(self._placement_view(side, tenant_ns, ns))) == self.cluster

    def _status_up(self, side: _TenantSide, kind: str, tenant_ns: str, source: Obj | None, copy: Obj | None) -> None:
        if source is not None and copy is not None:
            name = source["metadata"]["name"]
            if kind == "Service" and (status := load_balancer_status(source, copy)) is not None:
                side.up.patch_namespaced_service_status(name, tenant_ns, {"status": status})
            volume = mirror_volume(source, copy, cluster=self.cluster, tenant_namespace=tenant_ns) \
                if kind == "PersistentVolumeClaim" else None  # fmt: skip
            if volume is not None and (source.get("spec") or {}).get("volumeName") != volume["metadata"]["name"]:
                side.up.patch_persistent_volume(volume["metadata"]["name"], volume, field_manager=FIELD_MANAGER,
                                                force=True, _content_type=APPLY)  # fmt: skip
        if kind == "PersistentVolumeClaim":  # a claim gone (or recreated: another uid): its mirrored volume goes
            claims = [c for c in side.sources[kind].values() if _named(c)[0] == tenant_ns]
            mirrors = [m for m in side.mirrors.values() if _labels(m).get(LABEL_TENANT_NAMESPACE) == tenant_ns]
            for stale in stale_mirrors(mirrors, claims):
                ignore_not_found(side.up.delete_persistent_volume, stale)

    def _reflect_events(self) -> None:
        """Events about pods' copies, as Events on the tenant pods: only for pods placed here (a cluster a pod
        has left pushes nothing up), once per change of each source Event."""
        for event in self._events.take_all():
            involved = event.get("involvedObject") or {}
            copy_ns = self._copy_namespaces.get(involved.get("namespace") or "")
            origin = _origin(copy_ns) if copy_ns is not None else None
            side = self._side(origin[0]) if origin else None
            if origin is None or side is None or (self.pooling and said_by_the_pool(event)) or not self._reflected.is_new(event):
                continue
            tenant_ns = origin[1]
            tenant_pod = side.sources[POD].get((tenant_ns, involved.get("name") or ""))
            if tenant_pod is None:
                self._reflected.remember(event)
                continue
            placed = (tenant_pod["metadata"].get("annotations") or {}).get(POD_CLUSTER_ANNOTATION)
            if not pod_goes_here(placed, self.cluster, pooling=self.pooling):
                continue
            body = event_for_origin(event, tenant_pod, labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_SUPER_CLUSTER: self.cluster})
            try:
                side.up.create_namespaced_event(tenant_ns, k8s.CoreV1Event.model_validate(body))
            except ApiException as e:
                if not already_exists(e):
                    log.warning("syncer %s: reflecting Event %s on Pod %s/%s/%s failed: %s %s", self.cluster,
                                event["metadata"]["name"], side.name, tenant_ns, involved.get("name"), e.status,
                                e.reason)  # fmt: skip
                    continue
                side.up.patch_namespaced_event(body["metadata"]["name"], tenant_ns, {key: body[key] for key in (
                    "count", "message", "lastTimestamp") if key in body})  # fmt: skip
            self._reflected.remember(event)

    def _sync_pod(self, side: _TenantSide, tenant_ns: str, target: str, name: str) -> None:
        pod = side.sources[POD].get((tenant_ns, name))
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
                ignore_not_found(side.up.delete_namespaced_pod, name, tenant_ns, grace_period_seconds=0)
        elif copy is None:
            if self._made_not_seen(target, name):
                return  # made: its watch event queues the pod again
            if pod.get(SPEC_LEFT_OUT):  # its copy went: made again from the pod as it is now
                pod = side.read_pod(tenant_ns, name)
                if pod is None:
                    return  # gone meanwhile: its deletion's event comes
            # Remembered before the create: its watch event may come before its answer.
            self._copies_made.put((target, name), time.monotonic())
            try:
                drained(self.down.create_namespaced_pod(target, k8s.V1Pod.model_validate(pod_for_super(
                    pod, tenant=side.name, target_namespace=target, tenant_namespace=tenant_ns,
                    settings=self.settings)), _preload_content=False))  # fmt: skip
            except BaseException as e:
                self._copies_made.pop((target, name))  # not made: tried again at the next look
                if not isinstance(e, ApiException):
                    raise
                said = status_message(e.body) or str(e.reason)
                if e.status == 403 and not any(passing in said for passing in PASSING_REFUSALS):
                    self._refused(side, pod, tenant_ns, said)  # its Pod Security level (or another rule) refuses it
                elif not already_exists(e):
                    raise  # tried again after a backoff
        elif not self._behind_own_write(side, pod):
            # Bound first: the binding says PodScheduled as the copy does, so a copy scheduled and not running yet
            # costs no status push (the binding's watch event brings the pod back, and what is left is pushed).
            try:
                bound = self.nodes.bind(side.name, pod, copy)
            except Exception:  # its node not shown yet, or the tenant refused: no status held back by it
                self._push_status(side, pod, tenant_ns, copy)
                raise  # bound after a backoff
            if not bound:
                self._push_status(side, pod, tenant_ns, copy)

    def _behind_own_write(self, side: _TenantSide, pod: Obj) -> bool:
        """Whether the store still shows the pod as it was before this syncer's last write to it (a status push,
        a binding): a push onto it now would be refused (409, a write for nothing), and that write's own watch
        event queues the pod again. A copy's next status (Running) comes back faster than the tenant's event."""
        meta = pod["metadata"]
        key, version = (side.name, meta.get("uid") or ""), meta.get("resourceVersion")
        pushed_onto = self._pushed_onto.get(key)
        if pushed_onto is not None and pushed_onto != version:
            self._pushed_onto.pop(key)  # the store shows that push (or later): forgotten
        return pushed_onto == version or self.nodes.bound_not_shown(side.name, pod)

    def _made_not_seen(self, target: str, name: str) -> bool:
        """Whether this syncer made the copy and its store does not show it yet: made less than COPY_MADE_SECONDS
        ago, or found there when read after (a create would be refused as existing, and charged to the quota)."""
        made = self._copies_made.get((target, name))
        if made is None:
            return False
        if time.monotonic() - made < COPY_MADE_SECONDS:
            return True
        # Remembered anew before the read: a watch event meanwhile forgets it (and queues the pod), and wins.
        self._copies_made.put((target, name), time.monotonic())
        try:
            drained(self.down.read_namespaced_pod(name, target, _preload_content=False))
        except ApiException as e:
            self._copies_made.pop((target, name))
            if e.status != 404:
                raise
            return False  # gone (deleted before the store saw it): made again
        return True

    def _delete_copy(self, copy: Obj | None) -> None:
        if copy is not None and not _deleting(copy):
            ignore_not_found(self.down.delete_namespaced_pod, copy["metadata"]["name"], copy["metadata"]["namespace"])

    def _refused(self, side: _TenantSide, pod: dict[str, Any], tenant_ns: str, why: str) -> None:
        """The tenant pod says why the super cluster refuses it, once (its spec does not change: trying again
        at each pass costs one refused create, and a pod the rules allow later, or that moves, runs then)."""
        status = refused_status(cluster=self.cluster, why=why, now=format_rfc3339(utcnow()))
        told = (side.name, pod["metadata"].get("uid") or "")
        if says(_status(pod), status) or self._refusals_told.get(told) == why:
            return  # said already (the Store may not have seen that write yet when the pod comes round again)
        side.up.patch_namespaced_pod_status(pod["metadata"]["name"], tenant_ns, {"status": status})
        record_event(side.api, {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]},
                     reason="SuperClusterRefused", message=status["message"], warning=True)  # fmt: skip
        self._refusals_told.put(told, why)

    def _push_status(self, side: _TenantSide, pod: dict[str, Any], tenant_ns: str, copy: Obj) -> None:
        """The copy's status onto the tenant pod, if it says something new (the pool's own condition on the pod
        is no difference). Only onto the pod as it was read: if the pool scheduler moved it meanwhile (another
        cluster's copy owns its status now), the write is refused, and the move's event queues the pod again."""
        status = copied_status(_status(copy), shape=status_shape(pod.get("spec") or {}))
        if says(_status(pod), status):
            return
        meta = pod["metadata"]
        try:
            written = raw_json(side.up.patch_namespaced_pod_status(meta["name"], tenant_ns, {
                "metadata": {"resourceVersion": meta["resourceVersion"]}, **status_patch(status)},
                _preload_content=False))  # fmt: skip
        except ApiException as e:
            if e.status != 409:
                raise
            return
        if (written.get("metadata") or {}).get("resourceVersion") != meta["resourceVersion"]:  # it changed the pod
            self._pushed_onto.put((side.name, meta.get("uid") or ""), meta["resourceVersion"])


class NotOurs(Exception):
    """A super-cluster namespace that is not the copy the syncer was about to write: never written over."""


def _tenant_of(key: Key) -> str:
    return key[0]


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
    parser.add_argument("--management-kubeconfig",
                        help="the pool's management cluster (Tenants, their kubeconfigs); unset: in-cluster")
    parser.add_argument("--super-kubeconfig", required=True)
    parser.add_argument("--cluster", required=True, help="this super cluster's name in the pool (its SuperCluster)")
    parser.add_argument("--feature-gates", default=f"{FEATURE_SUPER_CLUSTER_POOLING}=true")
    parser.add_argument("--kubelet-address", default="127.0.0.1",
                        help="the address tenants' API servers reach this syncer's kubelet API at (in a pod: its IP)")
    parser.add_argument("--kubelet-port", type=int, default=KUBELET_PORT,
                        help="the port of that kubelet API, one for every tenant (0: a free one)")
    args = parser.parse_args()
    gates = dict(item.split("=", 1) for item in args.feature_gates.split(",") if "=" in item)
    management = client_from_own_kubeconfig_file(args.management_kubeconfig)
    # Read before the first copy is made, so that no namespace is labelled at a level it then leaves.
    settings = settings_of(read_cluster_object(management, SUPER_CLUSTERS, args.cluster), SuperClusterSettings())
    syncer = Syncer(management=management, super_cluster=client_from_own_kubeconfig_file(args.super_kubeconfig),
                    cluster=args.cluster, settings=settings, kubelet_address=args.kubelet_address,
                    kubelet_port=args.kubelet_port,
                    pooling=gates.get(FEATURE_SUPER_CLUSTER_POOLING, "true") == "true").start()  # fmt: skip
    own = follow_super_cluster(management, args.cluster, syncer).start()
    wait_for_termination()
    own.stop()
    syncer.stop()
    return 0


def follow_super_cluster(management: k8s.ApiClient, cluster: str, syncer: Syncer) -> Informer[Obj]:
    """Watches the syncer's own SuperCluster in the pool's management cluster: a change of its settings
    takes effect without a restart."""

    def seen(obj: Obj | None) -> None:
        syncer.use_settings(settings_of(obj, syncer.settings))

    return Informer(f"syncer-{cluster}-supercluster", k8s.CustomObjectsApi(management).list_cluster_custom_object,
                    group=GROUP, version=VERSION, plural=SUPER_CLUSTERS, field_selector=f"metadata.name={cluster}",
                    on_sync=lambda listed: seen(listed[0] if listed else None),
                    on_event=lambda kind, obj: seen(None if kind == "DELETED" else obj))  # fmt: skip


def settings_of(obj: Obj | None, current: SuperClusterSettings) -> SuperClusterSettings:
    """The settings its SuperCluster sets; without one (not registered yet, or deleted while the syncer goes
    away) or with one that does not validate (an older CRD let it through), the current ones stay."""
    if obj is None:
        return current
    try:
        return SuperClusterSettings.of(SuperCluster.from_kubernetes(obj).spec)
    except ValidationError as e:
        log.warning("SuperCluster %s does not validate, settings kept: %s", obj["metadata"].get("name"), e)
        return current


if __name__ == "__main__":
    sys.exit(main())
