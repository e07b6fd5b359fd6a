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

from kube.clients import SecretClients
from kube.metrics import Metrics
from kube.objects import record_event
from models.api import SuperCluster
from models.api.conditions import EventReason, PlacedReason
from models.names import (
    GROUP,
    PLACED_SLICE_ANNOTATION,
    PLACEMENT_STATUS_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    POD_CLUSTER_ANNOTATION,
    SCHEDULED_ANNOTATION,
    SUPER_CLUSTERS,
    VERSION,
)
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
            slice_ = held_slice(annotations)
            held[ns.metadata.name] = placement_of(annotations) if slice_ is not None else {}  # garbage holds nothing
            if slice_ is not None:
                slices[ns.metadata.name] = slice_
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
        decision = decide_namespace(name=name, annotations=annotations, hards=hards, clusters=clusters, held=held,
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

    def _refuse(self, ns: Any, decision: Refuse) -> PoolDecision:
        status = placement_status(decision)
        previous = (ns.metadata.annotations or {}).get(PLACEMENT_STATUS_ANNOTATION)
        if previous != status:
            self._core.patch_namespace(ns.metadata.name, {"metadata": {"annotations": {PLACEMENT_STATUS_ANNOTATION: status}}})
            self._event(ns, decision.reason, decision.message, warning=True)
        if previous_reason(previous) != decision.reason:  # a new failure, not the same one said anew
            Metrics.of_activity().placement_failed(reason=decision.reason)
        return PoolDecision(namespace=ns.metadata.name, placement=None, reason=f"{decision.reason}: {decision.message}",
                            diagnosis=decision.diagnosis)  # fmt: skip

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

    def _event(self, obj: Any, reason: PlacedReason | EventReason, message: str, *, warning: bool = False, kind: str = "Namespace") -> None:
        record_event(self._tenant, {"apiVersion": "v1", "kind": kind, "metadata": {
            "name": obj.metadata.name, "namespace": obj.metadata.namespace, "uid": obj.metadata.uid}},
            reason=reason, message=message, warning=warning)  # fmt: skip


def _raw(api: k8s.ApiClient, pod: Any) -> dict[str, Any]:
    return api.sanitize_for_serialization(pod)  # type: ignore[no-any-return]

