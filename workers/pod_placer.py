"""The pool's pod placer: each new tenant pod gets its super cluster as soon as it is seen, the way a
scheduler binds pods, without waiting for a scheduling pass, or is told at once that it fits nowhere.
Namespaces (their slices, where they go, moves) stay the scheduling pass's (activities/pool.py), which is
the placer's backstop for a pod still waiting long after its creation (PoolActivities.placers_since: 10
minutes while a replica holds the pool's Lease, 30 s while none does); a pod goes by the same rule either way
(models/pool/pods.py place_waiting).

Per served tenant, an informer keeps its pods (what placing reads of them); a work queue keyed by
(tenant, namespace), fair between tenants, places the namespace's waiting pods against the pool's record of
the namespace (its Tenant's status: placement and slice, which no tenant can write). The writes carry the
pod's resourceVersion: a pod the pass placed meanwhile keeps the pass's choice. A placed pod counts at once
(`_assumed`), before its own watch event comes back, so that a burst never puts more in a cluster than the
namespace's slices there hold. The leader of the pool's worker runs it (workers/pool.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from activities.pool import tell_placed, tell_unschedulable, unplaced_reasons
from kube.informer import Informer, Store
from kube.objects import drained
from kube.tenants import TenantRegistry
from kube.workqueue import WorkQueue
from kube.writes import write_all
from models.names import POD_CLUSTER_ANNOTATION
from models.pool.namespaces import OUTSIDE_SYSTEM_NAMESPACES
from models.pool.pods import WaitingPod, place_waiting
from models.pool.tenancy import recorded_placement, recorded_placements
from models.resources import Resources
from models.sharing import FINISHED_PHASES, pod_requests

log = logging.getLogger("tidepool.pod_placer")
Obj = dict[str, Any]
Key = tuple[str, str]  # (tenant, namespace)
Named = tuple[str, str]  # (namespace, name)
WORKERS = 8  # namespaces placed at once; each writes its pods WRITES_AT_ONCE at a time
WRITES_AT_ONCE = 16
EVENT_WRITERS = 4  # the placed pods' Scheduled Events, written beside the placements
MAX_EVENTS_PENDING = 2000


def _kept(pod: Obj) -> Obj:
    """What placing reads of a pod: who it is, its placement, its age, whether it still holds capacity,
    what pod_requests reads (containers' requests, overhead, pod-level resources, resized statuses), and its
    conditions (whether it says already that it fits nowhere)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp",
                                          "deletionTimestamp") if k in meta}
                    | {"annotations": {k: v for k, v in (meta.get("annotations") or {}).items()
                                       if k == POD_CLUSTER_ANNOTATION}},
        "spec": {k: spec[k] for k in ("containers", "initContainers", "overhead", "resources") if k in spec},
        "status": {k: status[k] for k in ("phase", "conditions", "containerStatuses", "initContainerStatuses")
                   if k in status},
    }  # fmt: skip


def _named(pod: Obj) -> Named:
    return pod["metadata"].get("namespace") or "", pod["metadata"]["name"]


def _cluster(pod: Obj) -> str | None:
    return (pod["metadata"].get("annotations") or {}).get(POD_CLUSTER_ANNOTATION)


def _holds(pod: Obj) -> bool:
    """Whether the pod holds (or will hold) capacity: not ended, not being deleted."""
    return not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in FINISHED_PHASES


class _Side:
    """One tenant's pods, indexed by namespace; a namespace is queued when a pod waits for a cluster or
    stops holding one (room for a waiting one), not on status churn."""

    def __init__(self, placer: PodPlacer, tenant: str, api: k8s.ApiClient) -> None:
        self.api, self.core = api, k8s.CoreV1Api(api)
        self._queue, self._tenant = placer.queue, tenant
        self._lock = threading.Lock()
        self._by_namespace: dict[str, dict[str, Obj]] = {}
        self._pods: Store[Named, Obj] = Store(_named, self._changed)
        self.informer: Informer[Obj] = Informer(
            f"pod-placer-{tenant}", self.core.list_pod_for_all_namespaces, on_sync=self._pods.sync,
            on_event=self._pods.event, transform=_kept, field_selector=OUTSIDE_SYSTEM_NAMESPACES)  # fmt: skip

    def pods_of(self, namespace: str) -> list[Obj]:
        with self._lock:
            return list(self._by_namespace.get(namespace, {}).values())

    def _changed(self, key: Named, old: Obj | None, new: Obj | None) -> None:
        namespace, name = key
        with self._lock:
            if new is None:
                pods = self._by_namespace.get(namespace, {})
                pods.pop(name, None)
                if not pods:
                    self._by_namespace.pop(namespace, None)
            else:
                self._by_namespace.setdefault(namespace, {})[name] = new
        waits = new is not None and _cluster(new) is None and _holds(new)
        freed = old is not None and _holds(old) and (new is None or not _holds(new))
        if waits or freed:
            self._queue.add((self._tenant, namespace))


class PodPlacer:
    def __init__(self, tenants: TenantRegistry, *, placed: Callable[[set[str]], None] = lambda _: None) -> None:
        """`placed`: told the clusters each round of placements wrote pods on (workers/pool.py wakes a pass
        when one of them drains: the pass tells such a pod that its cluster is Unreachable)."""
        self._tenants, self._placed = tenants, placed
        self.queue: WorkQueue[Key] = WorkQueue("pod-placer", self._handle, workers=WORKERS, owner=lambda k: k[0])
        self._lock = threading.Lock()
        self._sides: dict[str, _Side] = {}
        # Pods this placer wrote a cluster on that its store has not seen so yet, per (tenant, namespace):
        # name -> (uid, cluster, requests). Dropped once the store shows the write (or the pod gone).
        self._assumed: dict[Key, dict[str, tuple[str, str, Resources]]] = {}
        # Pods told they fit nowhere, per (tenant, namespace): name -> (uid, why). Dropped once placed or gone.
        self._told: dict[Key, dict[str, tuple[str, str]]] = {}
        self._stopped = False
        self._events = ThreadPoolExecutor(max_workers=EVENT_WRITERS, thread_name_prefix="pod-placer-event")
        self._events_pending = threading.BoundedSemaphore(MAX_EVENTS_PENDING)

    def start(self) -> PodPlacer:
        self.queue.start()
        for connection in self._tenants.connections():
            self.tenant_changed(connection.name)
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            sides, self._sides = list(self._sides.values()), {}
        for side in sides:
            side.informer.stop()
        self.queue.stop()
        self._events.shutdown(wait=True, cancel_futures=True)

    def tenant_changed(self, tenant: str) -> None:
        """Its informer follows the client the registry has for it now (none when it is not served)."""
        connection = self._tenants.get(tenant)
        api = connection.api if connection is not None and connection.served else None
        with self._lock:
            if self._stopped:
                return
            side = self._sides.get(tenant)
            if side is not None and side.api is not api:
                side.informer.stop()
                del self._sides[tenant]
                side = None
            if side is None and api is not None:
                side = self._sides[tenant] = _Side(self, tenant, api)
                side.informer.start()

    def records_changed(self, tenant: str, old: Obj | None, new: Obj | None) -> None:
        """The pool wrote its records of the tenant's namespaces: each one placed anew may have waiting pods."""
        before, after = recorded_placements(old), recorded_placements(new)
        self.queue.add_all([(tenant, ns) for ns in sorted(after) if after[ns] != before.get(ns)])

    def _handle(self, key: Key) -> None:
        tenant, namespace = key
        with self._lock:
            side = self._sides.get(tenant)
        if side is None or not side.informer.wait_synced(0):
            return  # not served, or not listed yet: its list queues every namespace
        record = recorded_placement(self._tenants.tenant_object(tenant), namespace)
        pods = side.pods_of(namespace)
        used, waiting = self._used_and_waiting(tenant, namespace, pods)
        if record is None or not record.placement or not waiting:
            return  # not placed (the pass says why), or nothing to place
        choices = place_waiting([WaitingPod(p["metadata"]["name"], pod_requests(p)) for p in waiting],
                                placement=record.placement, slice_=record.slice, used=used)  # fmt: skip
        writes: list[Callable[[], None]] = []
        clusters: set[str] = set()
        for pod in waiting:
            choice = choices[pod["metadata"]["name"]]
            if choice.cluster is not None:
                clusters.add(choice.cluster)
                writes.append(partial(self._place, side, tenant, pod, choice.cluster))
            elif self._first_telling(tenant, pod, why := unplaced_reasons(choice)):
                writes.append(partial(tell_unschedulable, side.api, pod, why))
        write_all(writes, at_once=WRITES_AT_ONCE, name="pod-placer-write")
        if clusters:
            self._placed(clusters)

    def _first_telling(self, tenant: str, pod: Obj, why: str) -> bool:
        """Whether this is news to the pod: the store may not show the last telling yet (its watch event comes
        later), and a burst queues the namespace again and again meanwhile."""
        meta = pod["metadata"]
        with self._lock:
            told = self._told.setdefault((tenant, meta["namespace"]), {})
            if told.get(meta["name"]) == (meta["uid"], why):
                return False
            told[meta["name"]] = (meta["uid"], why)
            return True

    def _used_and_waiting(self, tenant: str, namespace: str, pods: list[Obj]) -> tuple[dict[str, Resources], list[Obj]]:
        """What the namespace's live pods hold per cluster (counting the assumed ones), and its pods waiting
        for a cluster, oldest first."""
        used: dict[str, Resources] = {}
        waiting: list[Obj] = []
        live = {p["metadata"]["name"]: p for p in pods}
        with self._lock:
            assumed = self._assumed.get((tenant, namespace), {})
            for name, (uid, cluster, requests) in list(assumed.items()):
                pod = live.get(name)
                if pod is None or pod["metadata"].get("uid") != uid or _cluster(pod) is not None:
                    del assumed[name]  # seen (or gone): the store counts it from here on
                elif _holds(pod):
                    used[cluster] = used.get(cluster, Resources()) + requests
            if not assumed:
                self._assumed.pop((tenant, namespace), None)
            still_assumed = set(assumed)
            told = self._told.get((tenant, namespace), {})
            for name, (uid, _) in list(told.items()):
                pod = live.get(name)
                if pod is None or pod["metadata"].get("uid") != uid or _cluster(pod) is not None or not _holds(pod):
                    del told[name]  # no longer waiting: told again if it ever waits anew
            if not told:
                self._told.pop((tenant, namespace), None)
        for pod in pods:
            placed = _cluster(pod)
            if placed is not None and _holds(pod):
                used[placed] = used.get(placed, Resources()) + pod_requests(pod)
            elif placed is None and _holds(pod) and pod["metadata"]["name"] not in still_assumed:
                waiting.append(pod)
        waiting.sort(key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))
        return used, waiting

    def _place(self, side: _Side, tenant: str, pod: Obj, cluster: str) -> None:
        meta = pod["metadata"]
        try:
            drained(side.core.patch_namespaced_pod(meta["name"], meta["namespace"], {"metadata": {
                "resourceVersion": meta["resourceVersion"], "annotations": {POD_CLUSTER_ANNOTATION: cluster}}},
                _preload_content=False))  # fmt: skip
        except ApiException as e:
            if e.status in (404, 409):  # gone, or changed since read (placed by the pass, or the tenant edited it)
                return
            raise
        with self._lock:
            self._assumed.setdefault((tenant, meta["namespace"]), {})[meta["name"]] = (meta["uid"], cluster, pod_requests(pod))
        self._tell(partial(tell_placed, side.api, meta, cluster))

    def _tell(self, event: Callable[[], None]) -> None:
        """An Event written beside the placement, not in its way: the syncer follows the annotation, and a
        burst's pods reach their clusters without waiting for their Events. Past MAX_EVENTS_PENDING, written
        here: a burst slows down rather than hold Events without bound."""
        if self._events_pending.acquire(blocking=False):
            future = self._events.submit(event)
            future.add_done_callback(lambda _: self._events_pending.release())
        else:
            event()
