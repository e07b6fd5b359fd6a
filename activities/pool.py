"""The pool scheduler's activity: one pass over the tenant control plane and the super clusters that
places namespaces as quota slices, then pods into their namespace's clusters. Called by
workflows/pool.py, one pass at a time, so that concurrent namespaces never overcommit a cluster.

It reads, asks models/pool/namespaces.py (which annotations mean what, and what to do) and
models/pool/pods.py, and writes what they decide."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client as k8s
from temporalio import activity

from kube.metadata import ServedMetadata, served_metadata
from kube.metrics import Metrics
from kube.objects import list_cluster_objects, record_event
from models.api import SuperCluster
from models.api.conditions import EventReason, PlacedReason
from models.names import (
    PLACED_SLICE_ANNOTATION,
    PLACEMENT_STATUS_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    POD_CLUSTER_ANNOTATION,
    SCHEDULED_ANNOTATION,
    SUPER_CLUSTERS,
)
from models.pool.health import health_from_status
from models.pool.namespaces import (
    SYSTEM_NAMESPACES,
    Keep,
    Refuse,
    decide_namespace,
    held_slice,
    placement_of,
    placement_status,
    previous_reason,
)
from models.pool.placement import ClusterSnapshot, Policy
from models.pool.pods import choose_cluster
from models.pool.result import PoolDecision, PoolPassResult
from models.resources import Resources
from models.sharing import pod_requests


class PoolActivities:
    def __init__(self, *, tenant: k8s.ApiClient, policy: Policy = "spread") -> None:
        self._tenant = tenant
        self._core = k8s.CoreV1Api(tenant)
        self._policy = policy

    def _snapshots(self) -> tuple[list[ClusterSnapshot], dict[str, str]]:
        """The super clusters as the prober (workers/pool_health.py) last recorded them on their status:
        the pass never probes on its own, so one failed call here can move nothing."""
        snapshots: list[ClusterSnapshot] = []
        states: dict[str, str] = {}
        for obj in list_cluster_objects(self._tenant, SUPER_CLUSTERS):
            cluster = SuperCluster.from_kubernetes(obj)
            name, health = cluster.metadata.name, health_from_status(obj.get("status"))
            states[name] = health.summary
            snapshots.append(ClusterSnapshot(name=name, ready=not health.drains, allocatable=health.allocatable,
                                             headroom=cluster.spec.headroom, placed=Resources()))  # fmt: skip
        return snapshots, states

    @activity.defn
    def schedule_pool(self) -> PoolPassResult:
        clusters, health = self._snapshots()
        result = PoolPassResult(clusters=health)
        quotas: dict[str, list[dict[str, Any]]] = {}
        for quota in self._core.list_resource_quota_for_all_namespaces().items:
            hard = quota.spec.hard if quota.spec else None
            quotas.setdefault(served_metadata(quota).namespace or "", []).append(dict(hard or {}))
        namespaces = sorted((meta for meta in map(served_metadata, self._core.list_namespace().items)
                             if meta.name not in SYSTEM_NAMESPACES and not meta.deleting),
                            key=lambda meta: (meta.created, meta.name))  # fmt: skip
        held: dict[str, dict[str, int]] = {}  # namespace -> placement, as it stands after this pass
        slices: dict[str, Resources] = {}  # namespace -> the slice its placement holds
        for ns in namespaces:
            slice_ = held_slice(ns.annotations)
            held[ns.name] = placement_of(ns.annotations) if slice_ is not None else {}  # garbage holds nothing
            if slice_ is not None:
                slices[ns.name] = slice_
        for ns in namespaces:
            if ns.name not in quotas:
                continue
            decision = self._place(ns, quotas[ns.name], clusters, held, slices)
            if decision is not None:
                result.decisions.append(decision)
        self._place_pods(held, slices, result)
        return result

    def _place(self, ns: ServedMetadata, hards: list[dict[str, Any]], clusters: list[ClusterSnapshot],
               held: dict[str, dict[str, int]], slices: dict[str, Resources]) -> PoolDecision | None:  # fmt: skip
        name = ns.name
        decision = decide_namespace(name=name, annotations=ns.annotations, hards=hards, clusters=clusters, held=held,
                                    slices=slices, policy=self._policy)  # fmt: skip
        if isinstance(decision, Keep):
            return None
        if isinstance(decision, Refuse):
            return self._refuse(ns, decision)
        held[name], slices[name] = decision.placement, decision.slice
        placement_json = json.dumps(decision.placement, sort_keys=True)
        self._core.patch_namespace(name, {"metadata": {"annotations": {
            PLACEMENTS_ANNOTATION: placement_json, SCHEDULED_ANNOTATION: placement_json,
            PLACED_SLICE_ANNOTATION: json.dumps(decision.slice.to_kubernetes(), sort_keys=True),
            PLACEMENT_STATUS_ANNOTATION: placement_status(decision),
        }}})  # fmt: skip
        self._event(ns, "Scheduled", f"{decision.count} slices placed: {placement_json} ({decision.message})")
        Metrics.of_activity().placed(clusters=decision.placement)
        return PoolDecision(namespace=name, placement=decision.placement, reason=decision.message,
                            diagnosis=decision.diagnosis)  # fmt: skip

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

    def _place_pods(self, held: dict[str, dict[str, int]], slices: dict[str, Resources], result: PoolPassResult) -> None:
        listed = [(served_metadata(pod), pod) for pod in self._core.list_pod_for_all_namespaces().items]
        pods = [(meta, pod) for meta, pod in listed if held.get(meta.namespace or "")]
        used: dict[tuple[str, str], Resources] = {}
        waiting: list[tuple[ServedMetadata, k8s.V1Pod]] = []
        for meta, pod in pods:
            cluster = meta.annotations.get(POD_CLUSTER_ANNOTATION)
            phase = pod.status.phase if pod.status else None
            if cluster is None:
                waiting.append((meta, pod))
            elif phase not in ("Succeeded", "Failed") and not meta.deleting:
                key = (meta.namespace or "", cluster)
                used[key] = used.get(key, Resources()) + pod_requests(_raw(self._tenant, pod))
        for meta, pod in sorted(waiting, key=lambda item: (item[0].created, item[0].name)):
            ns = meta.namespace or ""
            requests = pod_requests(_raw(self._tenant, pod))
            choice = choose_cluster(requests=requests, placement=held[ns], slice_=slices[ns],
                                    used={c: used.get((ns, c), Resources()) for c in held[ns]})  # fmt: skip
            pod_key = f"{ns}/{meta.name}"
            if choice.cluster is None:
                result.pods_unplaced[pod_key] = "; ".join(f"{c}: {r}" for c, r in choice.reasons.items())
                self._event(meta, "FailedScheduling", f"fits in no super cluster of {ns}: {result.pods_unplaced[pod_key]}",
                            warning=True, kind="Pod")  # fmt: skip
                continue
            self._core.patch_namespaced_pod(meta.name, ns,
                                            {"metadata": {"annotations": {POD_CLUSTER_ANNOTATION: choice.cluster}}})
            used[(ns, choice.cluster)] = used.get((ns, choice.cluster), Resources()) + requests
            result.pods_placed[pod_key] = choice.cluster

    def _event(self, obj: ServedMetadata, reason: PlacedReason | EventReason, message: str, *, warning: bool = False,
               kind: str = "Namespace") -> None:  # fmt: skip
        record_event(self._tenant, {"apiVersion": "v1", "kind": kind, "metadata": {
            "name": obj.name, "namespace": obj.namespace, "uid": obj.uid}},
            reason=reason, message=message, warning=warning)  # fmt: skip


def _raw(api: k8s.ApiClient, pod: k8s.V1Pod) -> dict[str, Any]:
    raw: dict[str, Any] = api.sanitize_for_serialization(pod)
    return raw

