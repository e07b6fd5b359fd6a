"""The pool scheduler's activity: one pass over the tenant control plane and the super clusters that
places namespaces as quota slices, then pods into their namespace's clusters. Called by
workflows/pool.py, one pass at a time, so that concurrent namespaces never overcommit a cluster.

Annotations on a tenant namespace: the slice (user's), the placement (ours, or edited by a user: then
kept as mandatory), what we last scheduled (to tell an edit from our own write), the slice the placement
was made with (a changed slice is refused), and a status saying why a namespace is not placed."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client as k8s
from pydantic import BaseModel, Field
from temporalio import activity

from kube.clients import SecretClients
from kube.metrics import Metrics
from kube.objects import record_event
from models.api import SuperCluster
from models.names import (
    GROUP,
    PLACED_SLICE_ANNOTATION,
    PLACEMENT_STATUS_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    POD_CLUSTER_ANNOTATION,
    SCHEDULED_ANNOTATION,
    SLICE_ANNOTATION,
    SUPER_CLUSTERS,
    VERSION,
)
from models.pool.placement import ClusterSnapshot, PlacementRequest, schedule
from models.pool.pods import choose_cluster
from models.pool.slicing import SliceError, namespace_quota, parse_slice, slice_count
from models.resources import Resources
from models.sharing import pod_requests

SYSTEM_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease", "tidepool-system"})


class PoolDecision(BaseModel):
    namespace: str
    placement: dict[str, int] | None
    reason: str
    diagnosis: dict[str, str] = Field(default_factory=dict)


class PoolPassResult(BaseModel):
    clusters: dict[str, str] = Field(default_factory=dict)  # name -> "Ready, 14 free" / why not
    decisions: list[PoolDecision] = Field(default_factory=list)
    pods_placed: dict[str, str] = Field(default_factory=dict)  # namespace/pod -> cluster
    pods_unplaced: dict[str, str] = Field(default_factory=dict)  # namespace/pod -> why


def _json(text: str | None) -> dict[str, Any] | None:
    try:
        value = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _counts(value: dict[str, Any] | None) -> dict[str, int]:
    return {str(k): int(v) for k, v in (value or {}).items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}


class PoolActivities:
    def __init__(self, *, tenant: k8s.ApiClient, policy: str = "spread") -> None:
        self._tenant = tenant
        self._core = k8s.CoreV1Api(tenant)
        self._secrets = SecretClients(tenant)
        self._policy = policy

    def _snapshots(self) -> tuple[list[ClusterSnapshot], dict[str, str]]:
        snapshots, health = [], {}
        for obj in k8s.CustomObjectsApi(self._tenant).list_cluster_custom_object(GROUP, VERSION, SUPER_CLUSTERS)["items"]:
            cluster = SuperCluster.from_kubernetes(obj)
            name = cluster.metadata.name
            allocatable, ready = Resources(), False
            try:
                api = self._secrets.get(name=cluster.spec.kube_config_ref.name,
                                        namespace=cluster.spec.kube_config_ref.namespace)  # fmt: skip
                for node in k8s.CoreV1Api(api).list_node().items:
                    if node.spec.unschedulable:
                        continue
                    if any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []):
                        allocatable = allocatable + Resources(node.status.allocatable or {})
                        ready = True
                health[name] = "Ready" if ready else "NotReady: no Ready node"
            except Exception as e:  # noqa: BLE001 - an unreachable member is NotReady, its slices move
                health[name] = f"NotReady: {str(e)[:120]}"
            snapshots.append(ClusterSnapshot(name=name, ready=ready, allocatable=allocatable.only(("cpu", "memory")),
                                             headroom=cluster.spec.headroom, placed=Resources()))  # fmt: skip
        return snapshots, health

    @activity.defn
    def schedule_pool(self) -> PoolPassResult:
        clusters, health = self._snapshots()
        result = PoolPassResult(clusters=health)
        quotas: dict[str, list[dict[str, Any]]] = {}
        for quota in self._core.list_resource_quota_for_all_namespaces().items:
            quotas.setdefault(quota.metadata.namespace, []).append(dict(quota.spec.hard or {}))
        namespaces = sorted((ns for ns in self._core.list_namespace().items if ns.metadata.name not in SYSTEM_NAMESPACES
                             and not ns.metadata.deletion_timestamp),
                            key=lambda ns: (ns.metadata.creation_timestamp, ns.metadata.name))  # fmt: skip
        held: dict[str, dict[str, int]] = {}  # namespace -> placement, as it stands after this pass
        slices: dict[str, Resources] = {}  # namespace -> the slice its placement holds
        for ns in namespaces:
            annotations = ns.metadata.annotations or {}
            held[ns.metadata.name] = _counts(_json(annotations.get(PLACEMENTS_ANNOTATION)))
            placed = _json(annotations.get(PLACED_SLICE_ANNOTATION))
            try:
                slices[ns.metadata.name] = Resources(placed) if placed else parse_slice(annotations.get(SLICE_ANNOTATION))
            except (SliceError, ValueError):
                held[ns.metadata.name] = {}  # garbage is not capacity: _place reports it
        for ns in namespaces:
            name = ns.metadata.name
            if name not in quotas:
                continue
            decision = self._place(ns, quotas[name], clusters, held, slices)
            if decision is not None:
                result.decisions.append(decision)
        self._place_pods(held, slices, result)
        return result

    def _place(self, ns: Any, hards: list[dict[str, Any]], clusters: list[ClusterSnapshot],
               held: dict[str, dict[str, int]], slices: dict[str, Resources]) -> PoolDecision | None:  # fmt: skip
        name, annotations = ns.metadata.name, ns.metadata.annotations or {}
        current = _counts(_json(annotations.get(PLACEMENTS_ANNOTATION)))
        scheduled = _counts(_json(annotations.get(SCHEDULED_ANNOTATION)))
        try:
            slice_ = parse_slice(annotations.get(SLICE_ANNOTATION))
            count = slice_count(namespace_quota(hards), slice_)
            placed_slice = _json(annotations.get(PLACED_SLICE_ANNOTATION))
            if current and placed_slice is not None and Resources(placed_slice) != slice_:
                raise SliceError(f"the slice changed from {Resources(placed_slice).to_kubernetes()} to "
                                 f"{slice_.to_kubernetes()} after placement; clear the placement to reschedule")
        except SliceError as e:
            return self._refuse(ns, str(e), "InvalidSlice", {})
        ready = {c.name for c in clusters if c.ready}
        if current and current == scheduled and sum(current.values()) == count and set(current) <= ready:
            return None  # placed, and nothing moved: the common case
        snapshot = [ClusterSnapshot(c.name, c.ready, c.allocatable, c.headroom, self._held_there(c.name, name, held, slices))
                    for c in clusters]  # fmt: skip
        edited = bool(current) and current != scheduled
        request = PlacementRequest(namespace=name, slice=slice_, count=count, policy=self._policy,  # type: ignore[arg-type]
                                   mandatory=current if edited else {}, previous={} if edited else current)  # fmt: skip
        outcome = schedule(request, snapshot)
        if outcome.placement is None:
            return self._refuse(ns, outcome.message, "InsufficientCapacity", outcome.diagnosis)
        held[name], slices[name] = outcome.placement, slice_
        placement_json = json.dumps(outcome.placement, sort_keys=True)
        self._core.patch_namespace(name, {"metadata": {"annotations": {
            PLACEMENTS_ANNOTATION: placement_json, SCHEDULED_ANNOTATION: placement_json,
            PLACED_SLICE_ANNOTATION: json.dumps(slice_.to_kubernetes(), sort_keys=True),
            PLACEMENT_STATUS_ANNOTATION: json.dumps({"type": "Placed", "status": "True", "reason": "Scheduled",
                                                     "message": outcome.message}),
        }}})  # fmt: skip
        self._event(ns, "Scheduled", f"{count} slices placed: {placement_json} ({outcome.message})")
        Metrics.of_activity().placed(clusters=outcome.placement)
        return PoolDecision(namespace=name, placement=outcome.placement, reason=outcome.message,
                            diagnosis=outcome.diagnosis)  # fmt: skip

    @staticmethod
    def _held_there(cluster: str, namespace: str, held: dict[str, dict[str, int]], slices: dict[str, Resources]) -> Resources:
        """What the other namespaces' slices hold on `cluster`."""
        total = Resources()
        for other, placement in held.items():
            if other != namespace and placement.get(cluster) and other in slices:
                total = total + Resources({k: v * placement[cluster] for k, v in slices[other].items()})
        return total

    def _refuse(self, ns: Any, message: str, reason: str, diagnosis: dict[str, str]) -> PoolDecision:
        status = json.dumps({"type": "Placed", "status": "False", "reason": reason, "message": message,
                             "clusters": diagnosis}, sort_keys=True)  # fmt: skip
        previous = (ns.metadata.annotations or {}).get(PLACEMENT_STATUS_ANNOTATION)
        if previous != status:
            self._core.patch_namespace(ns.metadata.name, {"metadata": {"annotations": {PLACEMENT_STATUS_ANNOTATION: status}}})
            self._event(ns, reason, message, warning=True)
        if (_json(previous) or {}).get("reason") != reason:  # a new failure, not the same one said anew
            Metrics.of_activity().placement_failed(reason=reason)
        return PoolDecision(namespace=ns.metadata.name, placement=None, reason=f"{reason}: {message}", diagnosis=diagnosis)

    def _place_pods(self, held: dict[str, dict[str, int]], slices: dict[str, Resources], result: PoolPassResult) -> None:
        pods = [p for p in self._core.list_pod_for_all_namespaces().items if held.get(p.metadata.namespace)]
        used: dict[tuple[str, str], Resources] = {}
        waiting = []
        for pod in pods:
            cluster = (pod.metadata.annotations or {}).get(POD_CLUSTER_ANNOTATION)
            if cluster is None:
                waiting.append(pod)
            elif pod.status.phase not in ("Succeeded", "Failed") and not pod.metadata.deletion_timestamp:
                key = (pod.metadata.namespace, cluster)
                used[key] = used.get(key, Resources()) + pod_requests(_raw(self._tenant, pod))
        for pod in sorted(waiting, key=lambda p: (p.metadata.creation_timestamp, p.metadata.name)):
            ns = pod.metadata.namespace
            requests = pod_requests(_raw(self._tenant, pod))
            choice = choose_cluster(requests=requests, placement=held[ns], slice_=slices[ns],
                                    used={c: used.get((ns, c), Resources()) for c in held[ns]})  # fmt: skip
            key = f"{ns}/{pod.metadata.name}"
            if choice.cluster is None:
                result.pods_unplaced[key] = "; ".join(f"{c}: {r}" for c, r in choice.reasons.items())
                self._event(pod, "FailedScheduling", f"fits in no super cluster of {ns}: {result.pods_unplaced[key]}",
                            warning=True, kind="Pod")  # fmt: skip
                continue
            self._core.patch_namespaced_pod(pod.metadata.name, ns,
                                            {"metadata": {"annotations": {POD_CLUSTER_ANNOTATION: choice.cluster}}})
            used[(ns, choice.cluster)] = used.get((ns, choice.cluster), Resources()) + requests
            result.pods_placed[key] = choice.cluster

    def _event(self, obj: Any, reason: str, message: str, *, warning: bool = False, kind: str = "Namespace") -> None:
        record_event(self._tenant, {"apiVersion": "v1", "kind": kind, "metadata": {
            "name": obj.metadata.name, "namespace": obj.metadata.namespace, "uid": obj.metadata.uid}},
            reason=reason, message=message, warning=warning)  # fmt: skip


def _raw(api: k8s.ApiClient, pod: Any) -> dict[str, Any]:
    return api.sanitize_for_serialization(pod)  # type: ignore[no-any-return]

