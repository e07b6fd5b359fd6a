"""What a provider can share: (allocatable of physical nodes − requests of the pods that run on them)
× sharing percentage, clamped at zero per resource, with exact quantities (seed 001, Liqo's formula
without its bugs). Works on objects as the API server serves them in JSON (camelCase dicts), so that
activities/capacity.py can feed it from raw list and watch responses.

`CapacityAggregate` keeps the two totals current event by event, O(1) per event, so that a push reads
two sums instead of listing every pod of the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from models.names import LABEL_NODE_TYPE, LABEL_OFFLOADED, VIRTUAL_NODE_TYPE
from models.resources import Resources

Obj = Mapping[str, Any]
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
# Every pod that counts holds one of its node's pod slots.
POD_SLOT = Resources(pods=1)


def _requests(container: Obj) -> Resources:
    return Resources.from_kubernetes(((container.get("resources") or {}).get("requests")) or {})


def pod_requests(pod: Obj) -> Resources:
    """kubectl's rule (PodRequestsAndLimits), as the scheduler applies it since Kubernetes 1.29: the sum
    of the containers, and of restartable init containers (sidecars, restartPolicy Always) which run
    alongside them; at least each regular init container plus the sidecars started before it; plus the
    pod overhead."""
    spec = pod.get("spec") or {}
    total = Resources.total(_requests(c) for c in spec.get("containers") or [])
    sidecars = Resources()
    for init in spec.get("initContainers") or []:
        if init.get("restartPolicy") == "Always":
            sidecars = sidecars + _requests(init)
            total = total + _requests(init)
        else:
            total = total.maximum(_requests(init) + sidecars)
    return total + Resources.from_kubernetes(spec.get("overhead") or {})


def is_physical_node(node: Obj) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_NODE_TYPE) != VIRTUAL_NODE_TYPE and labels.get("type") != VIRTUAL_NODE_TYPE


def node_allocatable(node: Obj) -> Resources:
    return Resources.from_kubernetes((node.get("status") or {}).get("allocatable") or {})


def counts_against_capacity(pod: Obj, virtual_nodes: Iterable[str] = ()) -> bool:
    """A pod holds capacity of a physical node when it is bound to one and has not finished. Pods not
    yet scheduled hold nothing yet; pods on virtual nodes run elsewhere; pods offloaded into this
    cluster from a consumer are counted by nobody (counting them made Liqo's advertised size change at
    every push, PR 445). A terminating pod still holds its resources until it is gone."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    node = spec.get("nodeName")
    if not node or node in virtual_nodes or status.get("phase") in FINISHED_PHASES:
        return False
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_OFFLOADED) != "true"


def shared_resources(*, allocatable: Resources, used: Resources, percent: int) -> Resources:
    """Clamped after subtracting, never before: Liqo clamped first and advertised negative memory."""
    return (allocatable - used.only(allocatable)).clamp_at_zero().scale(percent)


def capacity_changed(previous: Resources, current: Resources, threshold_percent: int) -> bool:
    """True when any resource moved by more than `threshold_percent` of its previous value, or appeared
    or vanished."""
    for name in set(previous) | set(current):
        before, after = previous.get_or_zero(name), current.get_or_zero(name)
        if before == 0 or after == 0:
            if before != after:
                return True
            continue
        if abs(after - before) * 100 > before * threshold_percent:
            return True
    return False


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class CapacityAggregate:
    """Totals of allocatable (physical nodes) and used (counted pods), kept per object so that a
    MODIFIED or DELETED event takes back exactly what the object had added."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[str, Resources]] = {}  # key -> (node name, allocatable if physical)
        self._virtual_nodes: set[str] = set()
        self._pods: dict[str, tuple[str, Resources]] = {}  # key -> (node name, requests if counted)
        self._allocatable = Resources()
        self._used = Resources()

    @classmethod
    def from_lists(cls, nodes: Iterable[Obj], pods: Iterable[Obj]) -> CapacityAggregate:
        aggregate = cls()
        aggregate.reset_nodes(nodes)
        aggregate.reset_pods(pods)
        return aggregate

    def reset_nodes(self, nodes: Iterable[Obj]) -> None:
        self._nodes.clear()
        self._virtual_nodes.clear()
        self._allocatable = Resources()
        for node in nodes:
            self.apply_node("ADDED", node)

    def reset_pods(self, pods: Iterable[Obj]) -> None:
        self._pods.clear()
        self._used = Resources()
        for pod in pods:
            self.apply_pod("ADDED", pod)

    def apply_node(self, event: str, node: Obj) -> None:
        key = _key(node)
        old = self._nodes.pop(key, None)
        if old is not None:
            self._allocatable = self._allocatable - old[1]
            self._virtual_nodes.discard(old[0])
        if event == "DELETED":
            return
        name = (node.get("metadata") or {}).get("name", "")
        if is_physical_node(node):
            allocatable = node_allocatable(node)
            self._nodes[key] = (name, allocatable)
            self._allocatable = self._allocatable + allocatable
        else:
            self._nodes[key] = (name, Resources())
            self._virtual_nodes.add(name)
        # Pods already bound to a node that turned out virtual no longer count (rare: a relabelled node).
        if not is_physical_node(node):
            for pod_key, (pod_node, requests) in list(self._pods.items()):
                if pod_node == name and requests:
                    self._used = self._used - requests
                    self._pods[pod_key] = (pod_node, Resources())

    def apply_pod(self, event: str, pod: Obj) -> None:
        key = _key(pod)
        old = self._pods.pop(key, None)
        if old is not None:
            self._used = self._used - old[1]
        if event == "DELETED":
            return
        node = (pod.get("spec") or {}).get("nodeName") or ""
        requests = pod_requests(pod) + POD_SLOT if counts_against_capacity(pod, self._virtual_nodes) else Resources()
        self._pods[key] = (node, requests)
        self._used = self._used + requests

    def allocatable(self) -> Resources:
        return self._allocatable

    def used(self) -> Resources:
        return self._used
