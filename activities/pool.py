"""The pool scheduler's activity: one pass over the tenant control plane and the super clusters that
places namespaces as quota slices, then pods into their namespace's clusters; and the two later steps of
moving a namespace's slices (models/pool/moves.py: `move_pods`, `finish_move`). Called by
workflows/pool.py, one activity at a time, so that concurrent namespaces never overcommit a cluster.

It reads, asks models/pool/namespaces.py (which annotations mean what, and what to do),
models/pool/pods.py and models/pool/moves.py, and writes what they decide."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from kube.clock import utcnow
from kube.metadata import ServedMetadata, served_metadata
from kube.metrics import Metrics
from kube.objects import list_cluster_objects, read_cluster_config, record_event
from models.api import SuperCluster
from models.api.clusterconfig import PoolConfig
from models.api.conditions import POD_SUPER_CLUSTER_CONDITION, EventReason, PlacedReason
from models.names import (
    DRAINING_ANNOTATION,
    MANDATORY_ANNOTATION,
    MOVED_FROM_ANNOTATION,
    PLACED_SLICE_ANNOTATION,
    PLACEMENT_STATUS_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    POD_CLUSTER_ANNOTATION,
    SCHEDULED_ANNOTATION,
    SUPER_CLUSTERS,
)
from models.pods import condition_of, says
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
)
from models.pool.placement import ClusterSnapshot, headroom
from models.pool.pods import choose_cluster
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
from models.resources import Resources
from models.sharing import FINISHED_PHASES, pod_requests
from models.times import format_rfc3339


class PoolActivities:
    def __init__(self, *, tenant: k8s.ApiClient) -> None:
        self._tenant = tenant
        self._core = k8s.CoreV1Api(tenant)

    def _snapshots(self, pool: PoolConfig) -> tuple[list[ClusterSnapshot], dict[str, str]]:
        """The super clusters as the prober (workers/pool_health.py) last recorded them on their status:
        the pass never probes on its own, so one failed call here can move nothing. Each keeps free its
        spec.headroom and the pool's headroomPercent of its allocatable."""
        snapshots: list[ClusterSnapshot] = []
        states: dict[str, str] = {}
        for obj in list_cluster_objects(self._tenant, SUPER_CLUSTERS):
            cluster = SuperCluster.from_kubernetes(obj)
            name, health = cluster.metadata.name, health_from_status(obj.get("status"))
            states[name] = health.summary
            kept_free = headroom(allocatable=health.allocatable, reserved=cluster.spec.headroom,
                                 percent=pool.headroom_percent)
            snapshots.append(ClusterSnapshot(name=name, health=health.state, allocatable=health.allocatable,
                                             headroom=kept_free, placed=Resources()))  # fmt: skip
        return snapshots, states

    @activity.defn
    def schedule_pool(self) -> PoolPassResult:
        pool = read_cluster_config(self._tenant).spec.pool  # ClusterConfig `tidepool` of the tenant control plane
        clusters, health = self._snapshots(pool)
        result = PoolPassResult(clusters=health)
        quotas: dict[str, list[dict[str, Any]]] = {}
        for quota in self._core.list_resource_quota_for_all_namespaces().items:
            hard = quota.spec.hard if quota.spec else None
            quotas.setdefault(served_metadata(quota).namespace or "", []).append(dict(hard or {}))
        namespaces = sorted((meta for meta in map(served_metadata, self._core.list_namespace().items)
                             if meta.name not in SYSTEM_NAMESPACES and not meta.deleting),
                            key=lambda meta: (meta.created, meta.name))  # fmt: skip
        placements: dict[str, dict[str, int]] = {}  # namespace -> placement, as it stands after this pass
        held: dict[str, dict[str, int]] = {}  # namespace -> what it holds: placement + draining
        slices: dict[str, Resources] = {}  # namespace -> the slice its placement holds
        for ns in namespaces:
            slice_ = held_slice(ns.annotations)
            placements[ns.name] = placement_of(ns.annotations) if slice_ is not None else {}  # garbage holds nothing
            held[ns.name] = holding(placements[ns.name], draining_of(ns.annotations)) if slice_ is not None else {}
            if slice_ is not None:
                slices[ns.name] = slice_
            if draining_of(ns.annotations):
                result.draining[ns.name] = draining_of(ns.annotations)
        live: list[PoolNamespaceEntry] | None = []
        for ns in namespaces:
            if ns.name not in quotas:
                continue
            decision = decide_namespace(name=ns.name, annotations=ns.annotations, hards=quotas[ns.name],
                                        clusters=clusters, held=held, slices=slices, pool_policy=pool.policy)  # fmt: skip
            recorded = self._place(ns, decision, held, slices, placements, result)
            if recorded is not None:
                result.decisions.append(recorded)
            if live is not None:  # what `tidepool simulate pool` replays, while the pass is small enough to record
                live.append(live_entry(ns.name, ns.annotations, quotas[ns.name], decision, placements[ns.name]))
                live = live if len(live) <= MAX_POOL_ENTRIES else None
        if live is not None and len(clusters) <= MAX_POOL_CLUSTERS:
            result.policy, result.live = pool.policy, live
            result.snapshot = [PoolClusterRecord(name=c.name, health=c.health, allocatable=c.allocatable.to_kubernetes(),
                                                 headroom=c.headroom.to_kubernetes()) for c in clusters]  # fmt: skip
        unreachable = {c.name for c in clusters if c.drains}
        self._place_pods(placements, slices, unreachable, result)
        return result

    def _place(self, ns: ServedMetadata, decision: NamespaceDecision, held: dict[str, dict[str, int]],
               slices: dict[str, Resources], placements: dict[str, dict[str, int]],
               result: PoolPassResult) -> PoolDecision | None:  # fmt: skip
        """Writes what `decision` says on the namespace; returns its record, None when it kept all as it was."""
        name = ns.name
        if isinstance(decision, Keep):
            return None
        if isinstance(decision, Refuse):
            return self._refuse(ns, decision)
        # What the scheduler last wrote: a user's edit or clear leaves it, so it says where pods run now.
        previous = scheduled_of(ns.annotations) or placement_of(ns.annotations)
        already = draining_of(ns.annotations)
        draining = drain_after(previous=previous, placement=decision.placement, draining=already)
        placements[name], slices[name] = decision.placement, decision.slice
        held[name] = holding(decision.placement, draining)
        placement_json = json.dumps(decision.placement, sort_keys=True)
        self._core.patch_namespace(name, {"metadata": {"annotations": {
            PLACEMENTS_ANNOTATION: placement_json, SCHEDULED_ANNOTATION: placement_json,
            PLACED_SLICE_ANNOTATION: json.dumps(decision.slice.to_kubernetes(), sort_keys=True),
            PLACEMENT_STATUS_ANNOTATION: placement_status(decision), MANDATORY_ANNOTATION: mandatory_annotation(decision),
            DRAINING_ANNOTATION: json.dumps(draining, sort_keys=True) if draining else None,
        }}})  # fmt: skip
        self._event(ns, "Scheduled", f"{decision.count} slices placed: {placement_json} ({decision.message})")
        if draining:
            result.draining[name] = draining
            if draining != already:
                self._event(ns, "Draining", f"slices leave {json.dumps(draining, sort_keys=True)}: pods are "
                                            "recreated elsewhere before anything is removed there")  # fmt: skip
        Metrics.of_activity().placed(clusters=decision.placement)
        return PoolDecision(namespace=name, placement=decision.placement, reason=decision.message,
                            diagnosis=decision.diagnosis, slice=decision.slice.to_kubernetes(), slices=decision.count,
                            mandatory=decision.mandatory)  # fmt: skip

    def _refuse(self, ns: ServedMetadata, decision: Refuse) -> PoolDecision:
        status = placement_status(decision)
        previous = ns.annotations.get(PLACEMENT_STATUS_ANNOTATION)
        if previous != status:
            self._core.patch_namespace(ns.name, {"metadata": {"annotations": {PLACEMENT_STATUS_ANNOTATION: status}}})
            self._event(ns, decision.reason, decision.message, warning=True)
        if previous_reason(previous) != decision.reason:  # a new failure, not the same one said anew
            Metrics.of_activity().placement_failed(reason=decision.reason)
        return PoolDecision(namespace=ns.name, placement=None, reason=f"{decision.reason}: {decision.message}",
                            diagnosis=decision.diagnosis)  # fmt: skip

    def _place_pods(self, placements: dict[str, dict[str, int]], slices: dict[str, Resources], unreachable: set[str],
                    result: PoolPassResult) -> None:  # fmt: skip
        """Pods not placed yet go to a cluster of their namespace's placement; a pod on an Unreachable
        cluster of the placement (its namespace fits nowhere else) says so. Pods on a cluster that left the
        placement are `move_pods`'s."""
        listed = [(served_metadata(pod), pod) for pod in self._core.list_pod_for_all_namespaces().items]
        pods = [(meta, pod) for meta, pod in listed if placements.get(meta.namespace or "")]
        for meta, pod in pods:
            cluster = meta.annotations.get(POD_CLUSTER_ANNOTATION)
            moving = MOVED_FROM_ANNOTATION in meta.annotations  # Recreating until its move ends: the saga's
            if cluster in placements[meta.namespace or ""] and not moving and not _ended(meta, pod):
                self._tell_reachability(meta, pod, cluster or "", unreachable=cluster in unreachable,
                                        why="its namespace's slices fit in no other super cluster")  # fmt: skip
        used: dict[tuple[str, str], Resources] = {}
        waiting: list[tuple[ServedMetadata, k8s.V1Pod]] = []
        for meta, pod in pods:
            cluster = meta.annotations.get(POD_CLUSTER_ANNOTATION)
            if cluster is None:
                waiting.append((meta, pod))
            elif not _ended(meta, pod):
                key = (meta.namespace or "", cluster)
                used[key] = used.get(key, Resources()) + pod_requests(_raw(self._tenant, pod))
        for meta, pod in sorted(waiting, key=lambda item: (item[0].created, item[0].name)):
            ns = meta.namespace or ""
            requests = pod_requests(_raw(self._tenant, pod))
            choice = choose_cluster(requests=requests, placement=placements[ns], slice_=slices[ns],
                                    used={c: used.get((ns, c), Resources()) for c in placements[ns]})  # fmt: skip
            pod_key = f"{ns}/{meta.name}"
            if choice.cluster is None:
                why = result.pods_unplaced[pod_key] = "; ".join(f"{c}: {r}" for c, r in choice.reasons.items())
                status = unschedulable_status(why=why, now=format_rfc3339(utcnow()))
                if not says(_raw(self._tenant, pod).get("status"), status):  # said once, not at every pass
                    self._core.patch_namespaced_pod_status(meta.name, ns, {"status": status})
                    self._event(meta, "FailedScheduling", f"fits in no super cluster of {ns}: {why}", warning=True,
                                kind="Pod")  # fmt: skip
                continue
            self._core.patch_namespaced_pod(meta.name, ns,
                                            {"metadata": {"annotations": {POD_CLUSTER_ANNOTATION: choice.cluster}}})
            used[(ns, choice.cluster)] = used.get((ns, choice.cluster), Resources()) + requests
            result.pods_placed[pod_key] = choice.cluster

    def _tell_reachability(self, meta: ServedMetadata, pod: k8s.V1Pod, cluster: str, *, unreachable: bool,
                           why: str) -> None:  # fmt: skip
        """A pod on an Unreachable cluster says so (condition and status.reason); once its cluster answers
        again, the condition says so too (the cluster's syncer clears the reason with its next push)."""
        status = _raw(self._tenant, pod).get("status") or {}
        if unreachable:
            patch = unreachable_status(cluster=cluster, why=why, now=format_rfc3339(utcnow()))
        elif (condition_of(status, POD_SUPER_CLUSTER_CONDITION) or {}).get("status") == "False":
            patch = ready_again_status(cluster=cluster, now=format_rfc3339(utcnow()))
        else:
            return
        if not says(status, patch):
            self._core.patch_namespaced_pod_status(meta.name, meta.namespace or "", {"status": patch})

    def _namespace_pods(self, namespace: str) -> tuple[ServedMetadata, list[tuple[ServedMetadata, k8s.V1Pod, PodView]]]:
        """The namespace and its pods; a namespace gone or going since the pass has nothing left to move."""
        try:
            ns = served_metadata(self._core.read_namespace(namespace))
        except ApiException as e:
            if e.status != 404:
                raise
            raise NamespaceGone(namespace) from None
        if ns.deleting:
            raise NamespaceGone(namespace)
        pods = []
        for pod in self._core.list_namespaced_pod(namespace).items:
            meta = served_metadata(pod)
            view = PodView(name=meta.name, cluster=meta.annotations.get(POD_CLUSTER_ANNOTATION),
                           moved_from=meta.annotations.get(MOVED_FROM_ANNOTATION),
                           phase=pod.status.phase if pod.status else None, deleting=meta.deleting)  # fmt: skip
            pods.append((meta, pod, view))
        return ns, sorted(pods, key=lambda item: (item[0].created, item[0].name))

    @activity.defn
    def move_pods(self, move: MoveInput) -> MoveProgress:
        try:
            return self._move_pods(move)
        except NamespaceGone:
            return MoveProgress(namespace=move.namespace)

    def _move_pods(self, move: MoveInput) -> MoveProgress:
        """The saga's second step: every live pod on a cluster its namespace's placement left is recreated on
        one of the placement's (annotations first read, then a Pending status; then the new cluster). A pod
        that fits nowhere stays where it is, and says why. Idempotent: a moved pod is on the placement."""
        ns, pods = self._namespace_pods(move.namespace)
        placement, draining, slice_ = placement_of(ns.annotations), draining_of(ns.annotations), held_slice(ns.annotations)
        progress = MoveProgress(namespace=move.namespace, draining=draining)
        if not placement or slice_ is None:
            return progress  # not placed (refused): nowhere to move to; its pods stay and the pass says why
        unreachable = {name for name, health in self._health().items() if health}
        used: dict[str, Resources] = {}
        for _, pod, view in pods:
            if view.live and view.cluster in placement:
                used[view.cluster] = used.get(view.cluster, Resources()) + pod_requests(_raw(self._tenant, pod))
        for meta, pod, view in pods:
            if not must_move(view, placement):
                continue
            old = view.cluster or ""
            requests = pod_requests(_raw(self._tenant, pod))
            choice = choose_cluster(requests=requests, placement=placement, slice_=slice_, used=used)
            if choice.cluster is None:
                why = progress.stuck[meta.name] = "; ".join(f"{c}: {r}" for c, r in choice.reasons.items())
                self._tell_reachability(meta, pod, old, unreachable=old in unreachable, why=why)
                continue
            # One write, on the pod as read: the new cluster and the Pending status together (the pods/status
            # subresource takes metadata too). Written one after the other, the old cluster's syncer pushed
            # its copy's Running back between them, and the second write, refused, started over each time.
            self._core.patch_namespaced_pod_status(meta.name, move.namespace, {
                "metadata": {"resourceVersion": pod.metadata.resource_version if pod.metadata else None,
                             "annotations": {POD_CLUSTER_ANNOTATION: choice.cluster,
                                             MOVED_FROM_ANNOTATION: moved_from(view, new=choice.cluster)}},
                "status": recreating_status(old=old, new=choice.cluster, now=format_rfc3339(utcnow())),
            })  # fmt: skip
            used[choice.cluster] = used.get(choice.cluster, Resources()) + requests
            progress.moved[meta.name] = f"{old} → {choice.cluster}"
            self._event(meta, "MovedPod", f"recreated on super cluster {choice.cluster}: its slices left {old}",
                        kind="Pod")  # fmt: skip
        ns, pods = self._namespace_pods(move.namespace)  # as the moves left them
        views = [view for _, _, view in pods]
        progress.waiting = [v.name for v in views if v.moved_from is not None and v.live and v.phase != "Running"]
        progress.finishable = finished_clusters(draining=draining, placement=placement, pods=views)
        return progress

    @activity.defn
    def finish_move(self, move: MoveInput) -> MoveProgress:
        try:
            return self._finish_move(move)
        except NamespaceGone:
            return MoveProgress(namespace=move.namespace)

    def _finish_move(self, move: MoveInput) -> MoveProgress:
        """The saga's last step, for the draining clusters whose moved pods all run: moved-from is cleared on
        their pods, then the clusters leave `draining` (their syncers delete the namespace there). Each
        write is idempotent, and a crash between them leaves a state the next try finishes."""
        ns, pods = self._namespace_pods(move.namespace)
        placement, draining = placement_of(ns.annotations), draining_of(ns.annotations)
        done = finished_clusters(draining=draining, placement=placement, pods=[view for _, _, view in pods])
        for meta, pod, view in pods:
            if view.moved_from in done:
                self._core.patch_namespaced_pod(meta.name, move.namespace,
                                                {"metadata": {"annotations": {MOVED_FROM_ANNOTATION: None}}})
                if view.live:
                    self._tell_reachability(meta, pod, view.cluster or "", unreachable=False, why="")
        left = {c: n for c, n in draining.items() if c not in done}
        if done:
            self._core.patch_namespace(move.namespace, {"metadata": {"annotations": {
                DRAINING_ANNOTATION: json.dumps(left, sort_keys=True) if left else None}}})  # fmt: skip
            self._event(ns, "MoveFinished", f"every pod moved from {', '.join(done)} runs elsewhere: removed there")
        return MoveProgress(namespace=move.namespace, draining=left, finishable=done)

    def _health(self) -> dict[str, bool]:
        """Whether each super cluster drains (Unreachable), as the prober last wrote it."""
        return {obj["metadata"]["name"]: health_from_status(obj.get("status")).drains
                for obj in list_cluster_objects(self._tenant, SUPER_CLUSTERS)}  # fmt: skip

    def _event(self, obj: ServedMetadata, reason: PlacedReason | EventReason, message: str, *, warning: bool = False,
               kind: str = "Namespace") -> None:  # fmt: skip
        record_event(self._tenant, {"apiVersion": "v1", "kind": kind, "metadata": {
            "name": obj.name, "namespace": obj.namespace, "uid": obj.uid}},
            reason=reason, message=message, warning=warning)  # fmt: skip


class NamespaceGone(Exception):
    """A namespace deleted (or being deleted) between the pass and a move step."""




def _ended(meta: ServedMetadata, pod: k8s.V1Pod) -> bool:
    return meta.deleting or (pod.status.phase if pod.status else None) in FINISHED_PHASES


def _raw(api: k8s.ApiClient, pod: k8s.V1Pod) -> dict[str, Any]:
    raw: dict[str, Any] = api.sanitize_for_serialization(pod)
    return raw

