"""The pool scheduler's activity: one pass over every Tenant's control plane and the super clusters that
places namespaces as quota slices, then pods into their namespace's clusters; and the two later steps of
moving a namespace's slices (models/pool/moves.py: `move_pods`, `finish_move`). Called by
workflows/pool.py, one activity at a time, so that concurrent namespaces never overcommit a cluster.

One capacity account for every tenant: a namespace is `<tenant>/<namespace>` in the pass's books
(models/pool/tenancy.py); namespaces that still need slices are tried in the tenants' fair order
(models/pool/fairness.py); a tenant whose control plane does not answer keeps what its Tenant's status last
said it holds, and its namespaces and pods are left as they are until it answers.

It reads, asks models/pool/namespaces.py (which annotations mean what, and what to do),
models/pool/pods.py and models/pool/moves.py, and writes what they decide."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from kube.clock import utcnow
from kube.errors import as_application_error
from kube.metadata import MalformedObject, ServedMetadata, served_items_json, served_metadata
from kube.metrics import Metrics
from kube.objects import drained, list_cluster_objects, read_cluster_config, read_cluster_object, record_event
from kube.status import CustomObjectStatus, replacing, write_status
from kube.tenants import TenantRegistry
from kube.writes import write_all
from models.api import SuperCluster
from models.api.clusterconfig import PoolConfig
from models.api.conditions import POD_SUPER_CLUSTER_CONDITION, EventReason, PlacedReason, condition
from models.api.tenant import NamespacePlacement
from models.names import (
    DRAINING_ANNOTATION,
    GROUP,
    MANDATORY_ANNOTATION,
    MOVED_FROM_ANNOTATION,
    PLACED_SLICE_ANNOTATION,
    PLACEMENT_STATUS_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    POD_CLUSTER_ANNOTATION,
    SCHEDULED_ANNOTATION,
    SUPER_CLUSTERS,
    TENANTS,
    VERSION,
)
from models.pods import condition_of, says
from models.pool.fairness import Ask, fair_order, pool_capacity
from models.pool.health import health_from_status
from models.pool.moves import (
    PodView,
    drain_after,
    draining_of,
    finished_clusters,
    holding,
    moved_from,
    must_move,
    ready_again_status,
    recreating_status,
    scheduled_of,
    unreachable_status,
    unschedulable_status,
)
from models.pool.namespaces import (
    OUTSIDE_SYSTEM_NAMESPACES,
    SYSTEM_NAMESPACES,
    Keep,
    NamespaceDecision,
    Refuse,
    decide_namespace,
    held_slice,
    live_entry,
    mandatory_annotation,
    placement_of,
    placement_status,
    previous_reason,
    requested_slices,
)
from models.pool.placement import ClusterSnapshot, headroom
from models.pool.pods import PodPlacement, WaitingPod, choose_cluster, place_waiting
from models.pool.result import (
    MAX_POOL_CLUSTERS,
    MAX_POOL_ENTRIES,
    MoveInput,
    MoveProgress,
    PoolClusterRecord,
    PoolDecision,
    PoolNamespaceEntry,
    PoolPassResult,
)
from models.pool.slicing import SliceError
from models.pool.tenancy import (
    holdings,
    namespace_id,
    recorded_entries,
    recorded_held,
    recorded_placements,
    split_namespace_id,
    trusted_annotations,
)
from models.resources import Resources
from models.sharing import FINISHED_PHASES, pod_requests
from models.times import format_rfc3339

# A tenant's control plane that takes longer than this to answer one call is unreachable for this pass (its
# client tries once: kube/tenants.py).
TENANT_REQUEST_TIMEOUT = 10.0
# Tenants read at once at the start of a pass.
log = logging.getLogger("tidepool.pool")
MAX_TENANT_READS = 16
# Pod writes of one tenant at once in a pass (its client keeps kube/clients.py CONNECTIONS_PER_CLIENT).
MAX_POD_WRITES = 16
# A new pod is the pod placer's (workers/pod_placer.py) for a while: a pass places or tells only those that
# waited longer. PLACER_GRACE while no replica holds the pool's Lease (its leader changing); PLACER_BACKSTOP
# while one does, so its placer runs: behind a burst's backlog of minutes, a pass placing after 30 s wrote the
# same pods as the placer (one of the two refused, 409), and the pass is left for a placer that stalls.
PLACER_GRACE = timedelta(seconds=30)
PLACER_BACKSTOP = timedelta(minutes=10)


@dataclass
class TenantView:
    """One tenant's control plane as a pass reads it."""

    name: str
    api: k8s.ApiClient
    records: dict[str, NamespacePlacement] = field(default_factory=dict)  # the pool's, from its Tenant's status
    namespaces: list[ServedMetadata] = field(default_factory=list)
    quotas: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def read(self) -> TenantView:
        """Its namespaces (not tidepool's own nor being deleted, oldest first), their annotations with what the pool
        owns taken from its records (models/pool/tenancy.py trusted_annotations), and their quotas' hards."""
        for quota in self.core.list_resource_quota_for_all_namespaces(_request_timeout=TENANT_REQUEST_TIMEOUT).items:
            hard = quota.spec.hard if quota.spec else None
            self.quotas.setdefault(served_metadata(quota).namespace or "", []).append(dict(hard or {}))
        listed = self.core.list_namespace(_request_timeout=TENANT_REQUEST_TIMEOUT).items
        self.namespaces = sorted((replace(meta, annotations=trusted_annotations(meta.annotations, self.records.get(meta.name),
                                                                                edits=True))
                                  for meta in map(served_metadata, listed)
                                  if meta.name not in SYSTEM_NAMESPACES and not meta.deleting),
                                 key=lambda meta: (meta.created, meta.name))  # fmt: skip
        return self


@dataclass(frozen=True)
class Books:
    """Every namespace's placement, what it holds (placement + draining) and its slice, by key, as they stand
    during the pass: what each decision reads and updates."""

    placements: dict[str, dict[str, int]] = field(default_factory=dict)
    held: dict[str, dict[str, int]] = field(default_factory=dict)
    slices: dict[str, Resources] = field(default_factory=dict)
    draining: dict[str, dict[str, int]] = field(default_factory=dict)
    mandatory: dict[str, dict[str, int]] = field(default_factory=dict)

    def _books(self) -> tuple[dict[str, Any], ...]:
        return self.placements, self.held, self.slices, self.draining, self.mandatory

    def of(self, key: str) -> tuple[Any, ...]:
        """What the books say of one namespace, to `restore` if a write of its decision fails."""
        return tuple(book.get(key) for book in self._books())

    def restore(self, key: str, saved: tuple[Any, ...]) -> None:
        for book, value in zip(self._books(), saved, strict=True):
            if value is None:
                book.pop(key, None)
            else:
                book[key] = value

    def record(self, key: str) -> NamespacePlacement | None:
        """The pool's record of a namespace, as the pass leaves it; None for one that holds nothing."""
        placement, draining = self.placements.get(key) or {}, self.draining.get(key) or {}
        if not (placement or draining) or key not in self.slices:
            return None
        return NamespacePlacement(placement=placement, draining=draining, slice=self.slices[key],
                                  mandatory=self.mandatory.get(key) or {})  # fmt: skip


class PoolActivities:
    def __init__(self, *, management: k8s.ApiClient, tenants: TenantRegistry,
                 placer_leads: Callable[[], bool] = lambda: False) -> None:  # fmt: skip
        """`placer_leads`: whether a replica holds the pool's Lease, as this one last saw it (its placer runs)."""
        self._management = management
        self._tenants = tenants
        self._placer_leads = placer_leads
        self._tenant_status = CustomObjectStatus(management, TENANTS)

    def _snapshots(self, pool: PoolConfig) -> tuple[list[ClusterSnapshot], dict[str, str]]:
        """The super clusters as the prober (workers/pool_health.py) last recorded them on their status:
        the pass never probes on its own, so one failed call here can move nothing. Each keeps free its
        spec.headroom and the pool's headroomPercent of its allocatable."""
        snapshots: list[ClusterSnapshot] = []
        states: dict[str, str] = {}
        for obj in list_cluster_objects(self._management, SUPER_CLUSTERS):
            cluster = SuperCluster.from_kubernetes(obj)
            name, health = cluster.metadata.name, health_from_status(obj.get("status"))
            states[name] = health.summary
            kept_free = headroom(allocatable=health.allocatable, reserved=cluster.spec.headroom,
                                 percent=pool.headroom_percent)
            snapshots.append(ClusterSnapshot(name=name, health=health.state, allocatable=health.allocatable,
                                             headroom=kept_free, placed=Resources()))  # fmt: skip
        return snapshots, states

    def _read_tenants(self, objects: dict[str, dict[str, Any]]) -> tuple[list[TenantView], dict[str, str], list[str]]:
        """The tenants the pass can reach (read at once: one that does not answer costs the pass one request
        timeout, not one per tenant), why each other one is left as it is (its Tenant's status says), and the
        tenants being removed, whose copies run until their syncers have drained them."""
        views: list[TenantView] = []
        missed: dict[str, str] = {}
        going: list[str] = []
        readable = []
        for connection in sorted(self._tenants.connections(), key=lambda c: c.name):
            if connection.deleting:
                going.append(connection.name)
            elif connection.api is None:
                missed[connection.name] = connection.problem or "no kubeconfig"
            else:
                readable.append(TenantView(connection.name, connection.api, records=recorded_placements(objects.get(connection.name))))
        with ThreadPoolExecutor(min(len(readable), MAX_TENANT_READS) or 1, thread_name_prefix="pool-tenant-read") as reads:
            for view, failure in zip(readable, reads.map(_read, readable), strict=True):
                if failure is None:
                    views.append(view)
                else:
                    missed[view.name] = failure
        return views, missed, going

    @activity.defn
    def schedule_pool(self) -> PoolPassResult:
        pool = read_cluster_config(self._management).spec.pool  # ClusterConfig `tidepool` of the management cluster
        clusters, health = self._snapshots(pool)
        result = PoolPassResult(clusters=health)
        # The Tenants as they are now (the registry's copies may not have seen the last pass's write): the pool's
        # records of every namespace, and the status this pass writes over.
        objects = {obj["metadata"]["name"]: obj for obj in list_cluster_objects(self._management, TENANTS)}
        views, missed, going = self._read_tenants(objects)
        books = Books()
        for view in views:
            for ns in view.namespaces:
                key, slice_ = namespace_id(view.name, ns.name), held_slice(ns.annotations)
                # What the pool placed (its record, in the annotations as the pass reads them); garbage holds nothing.
                books.placements[key] = scheduled_of(ns.annotations) if slice_ is not None else {}
                books.draining[key] = draining_of(ns.annotations) if slice_ is not None else {}
                books.held[key] = holding(books.placements[key], books.draining[key])
                books.mandatory[key] = view.records[ns.name].mandatory if ns.name in view.records else {}
                if slice_ is not None:
                    books.slices[key] = slice_
                if draining_of(ns.annotations):
                    result.draining[key] = draining_of(ns.annotations)
        for tenant in [*missed, *going]:  # its slices stay held at what it last held
            held, slices = recorded_entries(tenant, recorded_held(objects.get(tenant)))
            books.held.update(held)
            books.slices.update(slices)
        live: list[PoolNamespaceEntry] | None = []
        for view, ns in self._in_fair_order(views, books, clusters):
            if view.name in missed:
                continue  # a write to it failed this pass: the rest of it waits for the next
            key = namespace_id(view.name, ns.name)
            hards = view.quotas[ns.name]
            decision = decide_namespace(name=key, annotations=ns.annotations, hards=hards, clusters=clusters,
                                        held=books.held, slices=books.slices, pool_policy=pool.policy)  # fmt: skip
            saved = books.of(key)
            try:
                recorded = self._place(view, ns, decision, books, result)
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
                books.restore(key, saved)  # not written: the namespace stays as the pool last recorded it
                # One tenant's control plane refusing or not answering holds no other tenant back; what the
                # decision holds stays in the books (counted, so never promised twice) and the next pass tries again.
                missed[view.name] = _unreachable(e)
                continue
            if recorded is not None:
                result.decisions.append(recorded)
            if live is not None:  # what `tidepool simulate pool` replays, while the pass is small enough to record
                live.append(live_entry(key, ns.annotations, hards, decision, books.placements[key]))
                live = live if len(live) <= MAX_POOL_ENTRIES else None
        if live is not None and len(clusters) <= MAX_POOL_CLUSTERS:
            result.policy, result.live = pool.policy, live
            result.snapshot = [PoolClusterRecord(name=c.name, health=c.health, allocatable=c.allocatable.to_kubernetes(),
                                                 headroom=c.headroom.to_kubernetes()) for c in clusters]  # fmt: skip
        unreachable = {c.name for c in clusters if c.drains}
        for view in views:
            if view.name in missed:
                continue
            try:
                self._place_pods(view, books, unreachable, result)
            except (ApiException, urllib3.exceptions.HTTPError, OSError, MalformedObject) as e:
                missed[view.name] = _unreachable(e)  # its pods wait for the next pass; the other tenants' do not
        self._tell_tenants(views, missed, books, objects)
        return result

    def _in_fair_order(self, views: list[TenantView], books: Books,
                       clusters: list[ClusterSnapshot]) -> list[tuple[TenantView, ServedMetadata]]:  # fmt: skip
        """Namespaces with a quota: the placed ones that ask for nothing more first (each kept, or moved off a
        failed cluster, as it was), then those that still need slices, new or grown, in the tenants' fair order
        (models/pool/fairness.py)."""
        placed: list[tuple[TenantView, ServedMetadata]] = []
        asking: dict[tuple[str, str], tuple[TenantView, ServedMetadata]] = {}
        asks: list[Ask] = []
        for view in views:
            for ns in view.namespaces:
                if ns.name not in view.quotas:
                    continue
                current = sum(scheduled_of(ns.annotations).values())
                try:
                    slice_, count = requested_slices(ns.annotations, view.quotas[ns.name])
                except SliceError:
                    slice_, count = Resources(), 0  # refused whenever it comes: it asks for nothing
                if current and count <= current:  # placed, or shrinking: it asks for nothing more
                    placed.append((view, ns))
                    continue
                demand = Resources({k: v * (count - current) for k, v in slice_.items()})  # a grown quota: its extra
                asking[(view.name, ns.name)] = (view, ns)
                asks.append(Ask(tenant=view.name, namespace=ns.name, created=ns.created, demand=demand))
        placed.sort(key=lambda item: (item[1].created, item[0].name, item[1].name))
        held = {tenant: sum(by_cluster.values(), Resources()) for tenant, by_cluster in holdings(books.held, books.slices).items()}
        weights = {c.name: c.weight for c in self._tenants.connections()}
        ordered = fair_order(asks, held=held, weights=weights, capacity=pool_capacity(clusters))
        return [*placed, *(asking[(ask.tenant, ask.namespace)] for ask in ordered)]

    def _tell_tenants(self, views: list[TenantView], missed: dict[str, str], books: Books,
                      objects: dict[str, dict[str, Any]]) -> None:  # fmt: skip
        """Each Tenant's status: its key, whether the pass reached it, and what it holds (kept as it was for
        one the pass did not reach: the next pass counts it from there)."""
        held = holdings(books.held, books.slices)
        reached = {view.name for view in views}
        for connection in self._tenants.connections():
            obj = objects.get(connection.name)
            if obj is None or connection.deleting:
                continue
            fields: dict[str, Any] = {"key": connection.key}
            if connection.name in reached:  # read this pass: what it holds is known, even if a write failed later
                now_held = {c: r.to_kubernetes() for c, r in sorted(held.get(connection.name, {}).items())}
                fields["held"] = replacing((obj.get("status") or {}).get("held") or {}, now_held)
                records = {split_namespace_id(key)[1]: record.model_dump(mode="json", by_alias=True)
                           for key in books.placements if split_namespace_id(key)[0] == connection.name
                           and (record := books.record(key)) is not None}  # fmt: skip
                fields["placements"] = replacing((obj.get("status") or {}).get("placements") or {}, records)
            if connection.name in reached and connection.name not in missed:
                ready = condition("Ready", True, "Reachable", "the pool reads its control plane")
            elif connection.api is None:
                ready = condition("Ready", False, "InvalidKubeconfig", missed.get(connection.name, ""))
            else:
                ready = condition("Ready", False, "Unreachable", f"{missed.get(connection.name, '')}: its namespaces "
                                  "and pods are left as they are, and what they hold stays held")  # fmt: skip
            try:
                write_status(self._tenant_status, obj, fields=fields, conditions=[ready])
            except ApiException as e:  # deleted meanwhile, or a conflict: the next pass writes it
                if e.status not in (404, 409):
                    raise

    def _place(self, view: TenantView, ns: ServedMetadata, decision: NamespaceDecision, books: Books,
               result: PoolPassResult) -> PoolDecision | None:  # fmt: skip
        """Writes what `decision` says on the namespace; returns its record, None when it kept all as it was."""
        key = namespace_id(view.name, ns.name)
        if isinstance(decision, Keep):
            return None
        if isinstance(decision, Refuse):
            return self._refuse(view, ns, decision)
        # What the scheduler last wrote: a user's edit or clear leaves it, so it says where pods run now.
        previous = scheduled_of(ns.annotations)  # the pool's record: where its pods may run now
        already = draining_of(ns.annotations)
        draining = drain_after(previous=previous, placement=decision.placement, draining=already)
        books.placements[key], books.slices[key] = decision.placement, decision.slice
        books.draining[key], books.mandatory[key] = draining, dict(decision.mandatory)
        books.held[key] = holding(decision.placement, draining)
        placement_json = json.dumps(decision.placement, sort_keys=True)
        view.core.patch_namespace(ns.name, {"metadata": {"annotations": {
            PLACEMENTS_ANNOTATION: placement_json, SCHEDULED_ANNOTATION: placement_json,
            PLACED_SLICE_ANNOTATION: json.dumps(decision.slice.to_kubernetes(), sort_keys=True),
            PLACEMENT_STATUS_ANNOTATION: placement_status(decision), MANDATORY_ANNOTATION: mandatory_annotation(decision),
            DRAINING_ANNOTATION: json.dumps(draining, sort_keys=True) if draining else None,
        }}}, _request_timeout=TENANT_REQUEST_TIMEOUT)  # fmt: skip
        _event(view.api, ns, "Scheduled", f"{decision.count} slices placed: {placement_json} ({decision.message})")
        if draining:
            result.draining[key] = draining
            if draining != already:
                _event(view.api, ns, "Draining", f"slices leave {json.dumps(draining, sort_keys=True)}: pods are "
                                                 "recreated elsewhere before anything is removed there")  # fmt: skip
        Metrics.of_activity().placed(clusters=decision.placement)
        return PoolDecision(namespace=key, placement=decision.placement, reason=decision.message,
                            diagnosis=decision.diagnosis, slice=decision.slice.to_kubernetes(), slices=decision.count,
                            mandatory=decision.mandatory)  # fmt: skip

    def _refuse(self, view: TenantView, ns: ServedMetadata, decision: Refuse) -> PoolDecision:
        status = placement_status(decision)
        previous = ns.annotations.get(PLACEMENT_STATUS_ANNOTATION)
        if previous != status:
            view.core.patch_namespace(ns.name, {"metadata": {"annotations": {PLACEMENT_STATUS_ANNOTATION: status}}},
                                      _request_timeout=TENANT_REQUEST_TIMEOUT)  # fmt: skip
            _event(view.api, ns, decision.reason, decision.message, warning=True)
        if previous_reason(previous) != decision.reason:  # a new failure, not the same one said anew
            Metrics.of_activity().placement_failed(reason=decision.reason)
        return PoolDecision(namespace=namespace_id(view.name, ns.name), placement=None,
                            reason=f"{decision.reason}: {decision.message}", diagnosis=decision.diagnosis)  # fmt: skip

    def _place_pods(self, view: TenantView, books: Books, unreachable: set[str], result: PoolPassResult) -> None:
        """The backstop of the pod placer (workers/pod_placer.py), which places each new pod as it comes and
        tells one that fits nowhere: a pod still waiting long after its creation (`placers_since`) goes to a
        cluster of its namespace's placement here, or is told why not. A pod on an Unreachable cluster of the
        placement (its namespace fits nowhere else) says so. Pods on a cluster that left the placement are
        `move_pods`'s. Read as JSON, not as typed objects: a pass reads every pod of every tenant, and the
        client's typed models cost ten times the parse."""
        core = view.core
        body = core.list_pod_for_all_namespaces(field_selector=OUTSIDE_SYSTEM_NAMESPACES, _preload_content=False,
                                                _request_timeout=TENANT_REQUEST_TIMEOUT)  # fmt: skip
        listed = served_items_json(body)
        placements = {ns: books.placements.get(namespace_id(view.name, ns)) for ns in {m.namespace or "" for m, _ in listed}}
        pods = [(meta, pod) for meta, pod in listed if placements.get(meta.namespace or "")]
        for meta, pod in pods:
            cluster = meta.annotations.get(POD_CLUSTER_ANNOTATION)
            moving = MOVED_FROM_ANNOTATION in meta.annotations  # Recreating until its move ends: the saga's
            if cluster in (placements[meta.namespace or ""] or {}) and not moving and not _ended(meta, pod):
                _tell_reachability(view.api, meta, pod, cluster or "", unreachable=cluster in unreachable,
                                   why="its namespace's slices fit in no other super cluster")  # fmt: skip
        used: dict[tuple[str, str], Resources] = {}
        waiting: list[tuple[ServedMetadata, dict[str, Any]]] = []
        for meta, pod in pods:
            cluster = meta.annotations.get(POD_CLUSTER_ANNOTATION)
            if cluster is None:
                waiting.append((meta, pod))
            elif not _ended(meta, pod):
                key = (meta.namespace or "", cluster)
                used[key] = used.get(key, Resources()) + pod_requests(pod)
        # Decided one after the other (each choice counts the ones before it), written at once: a burst of
        # pods waits for the slowest write, not for the sum of them. Younger pods are the placer's: oldest
        # first, no choice here depends on them.
        placers_since = self.placers_since(utcnow())
        writes: list[Callable[[], None]] = []
        by_namespace: dict[str, list[tuple[ServedMetadata, dict[str, Any]]]] = {}
        for meta, pod in sorted(waiting, key=lambda item: (item[0].created, item[0].name)):
            if meta.created <= placers_since:
                by_namespace.setdefault(meta.namespace or "", []).append((meta, pod))
        for ns, its in sorted(by_namespace.items()):
            placement = placements[ns] or {}
            choices = place_waiting([WaitingPod(m.name, pod_requests(p)) for m, p in its],
                                    placement=placement, slice_=books.slices[namespace_id(view.name, ns)],
                                    used={c: used.get((ns, c), Resources()) for c in placement})  # fmt: skip
            for meta, pod in its:
                choice, pod_key = choices[meta.name], f"{namespace_id(view.name, ns)}/{meta.name}"
                if choice.cluster is not None:
                    writes.append(partial(_place_pod, core, meta, pod, choice.cluster, result.pods_placed, pod_key))
                    continue
                why = result.pods_unplaced[pod_key] = unplaced_reasons(choice)
                writes.append(partial(tell_unschedulable, view.api, pod, why))
        write_all(writes, at_once=MAX_POD_WRITES, name="pool-pod-write")
        result.pods_placed = dict(sorted(result.pods_placed.items()))  # written in any order, recorded in one

    def placers_since(self, now: datetime) -> datetime:
        """Pods created after this are the placer's still: the pass leaves them alone."""
        return now - (PLACER_BACKSTOP if self._placer_leads() else PLACER_GRACE)

    def _view(self, key: str) -> tuple[TenantView, str]:
        """The tenant view and namespace of a move's key. A tenant that is not served (no kubeconfig,
        removed) or does not answer fails the step for good: the workflow goes on with the other moves, and
        the next pass, once it answers, resumes this one from its annotations."""
        try:
            tenant, namespace = split_namespace_id(key)
        except ValueError as e:
            raise ApplicationError(str(e), type="InvalidMoveKey", non_retryable=True) from None
        connection = self._tenants.get(tenant)
        if connection is None or connection.api is None:
            raise ApplicationError(f"tenant {tenant} is not served ({connection.problem if connection else 'no Tenant'}):"
                                   f" the move of {namespace} waits for it", type="TenantUnreachable",
                                   non_retryable=True)  # fmt: skip
        return TenantView(tenant, connection.api), namespace

    def _namespace_pods(self, view: TenantView, namespace: str) -> tuple[ServedMetadata, list[tuple[ServedMetadata, dict[str, Any], PodView]]]:
        """The namespace and its pods; a namespace gone or going since the pass has nothing left to move."""
        try:
            ns = served_metadata(view.core.read_namespace(namespace, _request_timeout=TENANT_REQUEST_TIMEOUT))
        except ApiException as e:
            if e.status != 404:
                raise
            raise NamespaceGone(namespace) from None
        record = recorded_placements(read_cluster_object(self._management, TENANTS, view.name)).get(namespace)
        ns = replace(ns, annotations=trusted_annotations(ns.annotations, record, edits=False))
        if ns.deleting:
            raise NamespaceGone(namespace)
        pods = []
        listed = view.core.list_namespaced_pod(namespace, _preload_content=False, _request_timeout=TENANT_REQUEST_TIMEOUT)
        for meta, pod in served_items_json(listed):
            view_of_pod = PodView(name=meta.name, cluster=meta.annotations.get(POD_CLUSTER_ANNOTATION),
                                  moved_from=meta.annotations.get(MOVED_FROM_ANNOTATION),
                                  phase=(pod.get("status") or {}).get("phase"), deleting=meta.deleting)  # fmt: skip
            pods.append((meta, pod, view_of_pod))
        return ns, sorted(pods, key=lambda item: (item[0].created, item[0].name))

    @activity.defn
    def move_pods(self, move: MoveInput) -> MoveProgress:
        view, namespace = self._view(move.namespace)
        try:
            return self._move_pods(view, namespace, move)
        except NamespaceGone:
            return MoveProgress(namespace=move.namespace)
        except (urllib3.exceptions.HTTPError, OSError, MalformedObject) as e:
            raise _tenant_unreachable(view.name, e) from None

    def _move_pods(self, view: TenantView, namespace: str, move: MoveInput) -> MoveProgress:
        """The saga's second step: every live pod on a cluster its namespace's placement left is recreated on
        one of the placement's (annotations first read, then a Pending status; then the new cluster). A pod
        that fits nowhere stays where it is, and says why. Idempotent: a moved pod is on the placement."""
        ns, pods = self._namespace_pods(view, namespace)
        placement, draining, slice_ = placement_of(ns.annotations), draining_of(ns.annotations), held_slice(ns.annotations)
        progress = MoveProgress(namespace=move.namespace, draining=draining)
        if not placement or slice_ is None:
            return progress  # not placed (refused): nowhere to move to; its pods stay and the pass says why
        unreachable = {name for name, health in self._health().items() if health}
        used: dict[str, Resources] = {}
        for _, pod, pod_view in pods:
            if pod_view.live and pod_view.cluster in placement:
                used[pod_view.cluster] = used.get(pod_view.cluster, Resources()) + pod_requests(pod)
        for meta, pod, pod_view in pods:
            if not must_move(pod_view, placement):
                continue
            old = pod_view.cluster or ""
            requests = pod_requests(pod)
            choice = choose_cluster(requests=requests, placement=placement, slice_=slice_, used=used)
            if choice.cluster is None:
                why = progress.stuck[meta.name] = unplaced_reasons(choice)
                _tell_reachability(view.api, meta, pod, old, unreachable=old in unreachable, why=why)
                continue
            # One write, on the pod as read: the new cluster and the Pending status together (the pods/status
            # subresource takes metadata too). Written one after the other, the old cluster's syncer pushed
            # its copy's Running back between them, and the second write, refused, started over each time.
            view.core.patch_namespaced_pod_status(meta.name, namespace, {
                "metadata": {"resourceVersion": pod["metadata"].get("resourceVersion"),
                             "annotations": {POD_CLUSTER_ANNOTATION: choice.cluster,
                                             MOVED_FROM_ANNOTATION: moved_from(pod_view, new=choice.cluster)}},
                "status": recreating_status(old=old, new=choice.cluster, now=format_rfc3339(utcnow())),
            })  # fmt: skip
            used[choice.cluster] = used.get(choice.cluster, Resources()) + requests
            progress.moved[meta.name] = f"{old} → {choice.cluster}"
            _event(view.api, meta, "MovedPod", f"recreated on super cluster {choice.cluster}: its slices left {old}",
                   kind="Pod")  # fmt: skip
        ns, pods = self._namespace_pods(view, namespace)  # as the moves left them
        views = [pod_view for _, _, pod_view in pods]
        progress.waiting = [v.name for v in views if v.moved_from is not None and v.live and v.phase != "Running"]
        progress.finishable = finished_clusters(draining=draining, placement=placement, pods=views)
        return progress

    @activity.defn
    def finish_move(self, move: MoveInput) -> MoveProgress:
        view, namespace = self._view(move.namespace)
        try:
            return self._finish_move(view, namespace, move)
        except NamespaceGone:
            return MoveProgress(namespace=move.namespace)
        except (urllib3.exceptions.HTTPError, OSError, MalformedObject) as e:
            raise _tenant_unreachable(view.name, e) from None

    def _finish_move(self, view: TenantView, namespace: str, move: MoveInput) -> MoveProgress:
        """The saga's last step, for the draining clusters whose moved pods all run: moved-from is cleared on
        their pods, then the clusters leave `draining` (their syncers delete the namespace there). Each
        write is idempotent, and a crash between them leaves a state the next try finishes."""
        ns, pods = self._namespace_pods(view, namespace)
        placement, draining = placement_of(ns.annotations), draining_of(ns.annotations)
        done = finished_clusters(draining=draining, placement=placement, pods=[pod_view for _, _, pod_view in pods])
        for meta, pod, pod_view in pods:
            if pod_view.moved_from in done:
                view.core.patch_namespaced_pod(meta.name, namespace,
                                               {"metadata": {"annotations": {MOVED_FROM_ANNOTATION: None}}})
                if pod_view.live:
                    _tell_reachability(view.api, meta, pod, pod_view.cluster or "", unreachable=False, why="")
        left = {c: n for c, n in draining.items() if c not in done}
        if done:
            # The record first: it is what the syncers follow (the finished clusters drop their copies at once).
            k8s.CustomObjectsApi(self._management).patch_cluster_custom_object_status(
                GROUP, VERSION, TENANTS, view.name,
                {"status": {"placements": {namespace: {"draining": replacing(draining, left) or None}}}})  # fmt: skip
            view.core.patch_namespace(namespace, {"metadata": {"annotations": {
                DRAINING_ANNOTATION: json.dumps(left, sort_keys=True) if left else None}}})  # fmt: skip
            _event(view.api, ns, "MoveFinished", f"every pod moved from {', '.join(done)} runs elsewhere: removed there")
        return MoveProgress(namespace=move.namespace, draining=left, finishable=done)

    def _health(self) -> dict[str, bool]:
        """Whether each super cluster drains (Unreachable), as the prober last wrote it."""
        return {obj["metadata"]["name"]: health_from_status(obj.get("status")).drains
                for obj in list_cluster_objects(self._management, SUPER_CLUSTERS)}  # fmt: skip


def _read(view: TenantView) -> str | None:
    """Reads a tenant's namespaces and quotas into `view`; why it could not, if it could not."""
    try:
        view.read()
    except (ApiException, urllib3.exceptions.HTTPError, OSError, MalformedObject) as e:
        return _unreachable(e)
    return None


def _tell_reachability(api: k8s.ApiClient, meta: ServedMetadata, pod: dict[str, Any], cluster: str, *,
                       unreachable: bool, why: str) -> None:  # fmt: skip
    """A pod on an Unreachable cluster says so (condition and status.reason); once its cluster answers
    again, the condition says so too (the cluster's syncer clears the reason with its next push)."""
    status = pod.get("status") or {}
    if unreachable:
        patch = unreachable_status(cluster=cluster, why=why, now=format_rfc3339(utcnow()))
    elif (condition_of(status, POD_SUPER_CLUSTER_CONDITION) or {}).get("status") == "False":
        patch = ready_again_status(cluster=cluster, now=format_rfc3339(utcnow()))
    else:
        return
    if not says(status, patch):
        k8s.CoreV1Api(api).patch_namespaced_pod_status(meta.name, meta.namespace or "", {"status": patch})


def _place_pod(core: k8s.CoreV1Api, meta: ServedMetadata, pod: dict[str, Any], cluster: str, placed: dict[str, str],
               pod_key: str) -> None:  # fmt: skip
    """Onto the pod as read: the pod placer (workers/pod_placer.py) may have placed it meanwhile, and its
    choice stands (a 409 here)."""
    try:
        drained(core.patch_namespaced_pod(meta.name, meta.namespace or "", {"metadata": {
            "resourceVersion": pod["metadata"].get("resourceVersion"), "annotations": {POD_CLUSTER_ANNOTATION: cluster}}},
            _preload_content=False))  # fmt: skip
    except ApiException as e:
        if e.status in (404, 409):
            return
        raise
    placed[pod_key] = cluster  # only once written: the result says what the syncers will follow
    tell_placed(core.api_client, {"name": meta.name, "namespace": meta.namespace, "uid": meta.uid}, cluster)


def unplaced_reasons(choice: PodPlacement) -> str:
    """Why a pod fits in none of its namespace's clusters, cluster by cluster."""
    return "; ".join(f"{c}: {r}" for c, r in choice.reasons.items())


def tell_unschedulable(api: k8s.ApiClient, pod: dict[str, Any], why: str) -> None:
    """Pending with PodScheduled False (Unschedulable) and a FailedScheduling Event, as a scheduler says a
    pod fits nowhere; said once, not again while it says the same (the pod as read shows it)."""
    status = unschedulable_status(why=why, now=format_rfc3339(utcnow()))
    if says(pod.get("status"), status):
        return
    meta = pod["metadata"]
    try:
        k8s.CoreV1Api(api).patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status})
    except ApiException as e:
        if e.status == 404:  # gone meanwhile: nothing to tell
            return
        raise
    record_event(api, {"apiVersion": "v1", "kind": "Pod", "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")}},
                 reason="FailedScheduling", message=f"fits in no super cluster of {meta['namespace']}: {why}",
                 warning=True)  # fmt: skip


def tell_placed(api: k8s.ApiClient, meta: dict[str, Any], cluster: str) -> None:
    """The pod's `Scheduled` Event, as a scheduler's binding says it: `kubectl describe pod` and `tidepool
    explain pod` show where it went and when, whoever placed it (a pass or the pod placer). Best effort: the
    placement is the annotation; a lost Event loses only its telling."""
    try:
        record_event(api, {"apiVersion": "v1", "kind": "Pod", "metadata": meta}, reason="Scheduled",
                     message=f"placed on super cluster {cluster}: the most room left in its namespace's slices")  # fmt: skip
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
        log.warning("pod %s/%s: its Scheduled Event not written (%s)", meta.get("namespace"), meta.get("name"),
                    type(e).__name__)  # fmt: skip


def _event(api: k8s.ApiClient, obj: ServedMetadata, reason: PlacedReason | EventReason, message: str, *,
           warning: bool = False, kind: str = "Namespace") -> None:  # fmt: skip
    record_event(api, {"apiVersion": "v1", "kind": kind, "metadata": {
        "name": obj.name, "namespace": obj.namespace, "uid": obj.uid}},
        reason=reason, message=message, warning=warning)  # fmt: skip


def _unreachable(error: Exception) -> str:
    """Why a tenant's control plane is left alone this pass: the vocabulary's words, never a response body."""
    if isinstance(error, ApiException):
        return as_application_error(error).message
    if isinstance(error, MalformedObject):
        return f"its control plane answered an object that is not one: {error}"
    return f"its control plane did not answer ({type(error).__name__})"


def _tenant_unreachable(tenant: str, error: Exception) -> ApplicationError:
    return ApplicationError(f"tenant {tenant}: {_unreachable(error)}", type="TenantUnreachable", non_retryable=True)


class NamespaceGone(Exception):
    """A namespace deleted (or being deleted) between the pass and a move step."""



def _ended(meta: ServedMetadata, pod: dict[str, Any]) -> bool:
    return meta.deleting or (pod.get("status") or {}).get("phase") in FINISHED_PHASES
