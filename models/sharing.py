"""What a provider can share with one consumer: (allocatable of its physical nodes − requests of the pods
that hold them, except the pods that consumer offloaded here) × sharing percentage, clamped at zero per
resource after subtracting, with exact quantities (seed 001, Liqo's formula without its bugs).

Everything here works on objects as the API server serves them in JSON (camelCase dicts, e.g. the
items of `json.loads` of a list response or the objects of watch events), so that
kube/capacity.py can feed it without deserialising into client models (100,000 pods take 31 s
that way). `CapacityAggregate` keeps the totals current event by event, O(1) per event, so that
activities/peering.py reads a few sums at each push instead of listing every pod of the cluster, and
workers/early_push.py (with models/early_push.py) uses `spare` and `capacity_changed` to push early when a
consumer's offer moves.
"""

from __future__ import annotations

import decimal
from collections.abc import Collection, Iterable, Mapping, Set
from decimal import Decimal
from functools import lru_cache
from typing import Any, Final, NamedTuple

from pydantic import BaseModel, ConfigDict

from models.names import LABEL_NODE_TYPE, VIRTUAL_NODE_TYPE, foreign_cluster_of_namespace
from models.quantities import _EXACT, parse_quantity
from models.resources import Resources

Obj = Mapping[str, Any]

FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})
# Liqo's own label for its virtual nodes, accepted too so that a cluster peered by both is not
# counted twice.
LIQO_NODE_TYPE_LABEL: Final = "type"
# Every pod that holds capacity also holds one of its node's pod slots (allocatable "pods").
POD_SLOT: Final = Resources(pods=1)
# Resources a pod may request at pod level (spec.resources, PodLevelResources, beta and on by default
# since Kubernetes 1.34); other names keep the containers' aggregate.
_POD_LEVEL_RESOURCES: Final = frozenset({"cpu", "memory"})
_HUGEPAGES_PREFIX: Final = "hugepages-"

_Amounts = dict[str, Decimal]


# Quantity strings repeat endlessly across pods ("100m", "128Mi"); parsing one costs ~7 µs, so a
# cluster of 100,000 pods would spend seconds re-parsing the same few dozen strings.
@lru_cache(maxsize=4096)
def _parse_cached(text: str) -> Decimal:
    return parse_quantity(text)


def _amounts(resource_list: Any) -> _Amounts:
    if not isinstance(resource_list, Mapping):
        return {}
    return {
        str(name): _parse_cached(value) if isinstance(value, str) else parse_quantity(value)
        for name, value in resource_list.items()
    }


def _add(into: _Amounts, other: Mapping[str, Decimal]) -> None:
    for name, value in other.items():
        into[name] = into.get(name, Decimal(0)) + value


def _max(into: _Amounts, other: Mapping[str, Decimal]) -> None:
    for name, value in other.items():
        if name not in into or value > into[name]:
            into[name] = value


def _resize_infeasible(status: Obj) -> bool:
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "PodResizePending":
            return condition.get("reason") == "Infeasible"
    return False


def _effective(container: Obj, statuses: Mapping[str, Obj], infeasible: bool) -> _Amounts:
    """A container's requests. While an in-place resize is under way the node already holds the
    larger of what the spec asks, what the kubelet allocated and what runs (an infeasible resize holds
    only the latter two), so that is what counts."""
    spec = _amounts((container.get("resources") or {}).get("requests"))
    status = statuses.get(str(container.get("name")))
    if status is None or not isinstance(status.get("resources"), Mapping):
        return spec
    effective = {} if infeasible else dict(spec)
    _max(effective, _amounts(status["resources"].get("requests")))
    _max(effective, _amounts(status.get("allocatedResources")))
    return effective


def pod_requests(pod: Obj) -> Resources:
    """What a pod holds on its node, by the rule of Kubernetes 1.36 (k8s.io/component-helpers
    resource.PodRequests, as `kubectl describe node` calls it: pod-level requests and status
    resources on):

    - the sum of the regular containers;
    - restartable init containers (sidecars, `restartPolicy: Always`, Kubernetes 1.29+) run alongside
      the containers for the pod's whole life, so they are added like regular containers;
    - each regular init container runs alone with the sidecars started before it: the pod needs at
      least that much, per resource;
    - pod-level requests (spec.resources.requests, cpu/memory/hugepages) replace the containers'
      aggregate for the resources they name;
    - plus the pod overhead (RuntimeClass), which the node pays on top.
    """
    return Resources(_pod_amounts(pod))


def _pod_amounts(pod: Obj) -> _Amounts:
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    statuses = {
        str(s.get("name")): s
        for key in ("containerStatuses", "initContainerStatuses")
        for s in status.get(key) or []
        if isinstance(s, Mapping)
    }
    infeasible = bool(statuses) and _resize_infeasible(status)
    with decimal.localcontext(_EXACT):
        total: _Amounts = {}
        for container in spec.get("containers") or []:
            _add(total, _effective(container, statuses, infeasible))
        sidecars: _Amounts = {}
        init_floor: _Amounts = {}
        for init in spec.get("initContainers") or []:
            if init.get("restartPolicy") == "Always":
                requests = _effective(init, statuses, infeasible)
                _add(total, requests)
                _add(sidecars, requests)
                _max(init_floor, sidecars)
            else:
                # Status resources are not considered for regular init containers: they have finished.
                alone = _amounts((init.get("resources") or {}).get("requests"))
                _add(alone, sidecars)
                _max(init_floor, alone)
        _max(total, init_floor)
        pod_level = _amounts((spec.get("resources") or {}).get("requests"))
        for name, value in pod_level.items():
            if name in _POD_LEVEL_RESOURCES or name.startswith(_HUGEPAGES_PREFIX):
                total[name] = value
        _add(total, _amounts(spec.get("overhead")))
    return total


def is_physical_node(node: Obj) -> bool:
    """False for virtual nodes (tidepool's label, or Liqo's `type=virtual-node`): their capacity is
    another cluster's, and sharing it again would advertise what this cluster does not have."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_NODE_TYPE) != VIRTUAL_NODE_TYPE and labels.get(LIQO_NODE_TYPE_LABEL) != VIRTUAL_NODE_TYPE


# Taints that keep pods off a node: a pod of another cluster (or a pool's tenant) tolerates none of them but
# those its owner allows (the provider's admission policy refuses any other toleration on a consumer's pod).
_KEEPING_OUT = ("NoSchedule", "NoExecute")


def takes_foreign_pods(node: Obj, *, tolerated: Collection[str] = ()) -> bool:
    """Whether pods of another owner can be scheduled onto the node: not cordoned, and no NoSchedule or
    NoExecute taint but of a key in `tolerated` (a NotReady node has the not-ready one). A node its owner
    keeps apart (control plane, dedicated system nodes) is not capacity to share."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False
    return not any(isinstance(t, dict) and t.get("effect") in _KEEPING_OUT and t.get("key") not in tolerated
                   for t in spec.get("taints") or [])  # fmt: skip


def node_fields(node: Obj) -> dict[str, Any]:
    """The parts of a node the aggregate reads (`is_physical_node`, `takes_foreign_pods`, `_node_amounts`,
    its name): what kube/capacity.py keeps of each node as its page is parsed."""
    metadata, status, spec = node.get("metadata") or {}, node.get("status") or {}, node.get("spec") or {}
    labels = metadata.get("labels") or {}
    return {
        "metadata": {"name": metadata.get("name"),
                     "labels": {k: labels[k] for k in (LABEL_NODE_TYPE, LIQO_NODE_TYPE_LABEL) if k in labels}},
        "spec": {"unschedulable": bool(spec.get("unschedulable")),
                 "taints": [{"key": t.get("key"), "effect": t.get("effect")} for t in spec.get("taints") or []
                            if isinstance(t, dict) and t.get("effect") in _KEEPING_OUT]},
        "status": {k: status[k] for k in ("allocatable", "capacity") if k in status},
    }  # fmt: skip


def node_allocatable(node: Obj) -> Resources:
    """status.allocatable, or status.capacity when a node reports no allocatable (as kubectl does)."""
    return Resources(_node_amounts(node))


def _node_amounts(node: Obj) -> _Amounts:
    status = node.get("status") or {}
    return _amounts(status.get("allocatable") or status.get("capacity"))


def counts_against_capacity(pod: Obj, virtual_node_names: Set[str] = frozenset()) -> bool:
    """Whether a pod holds capacity of this cluster's physical nodes.

    - Succeeded/Failed pods hold nothing any more.
    - Pods not yet scheduled (no spec.nodeName) hold nothing yet: they consume capacity only once
      bound, and counting them would subtract the same demand twice once they are.
    - Pods bound to a virtual node run in another cluster.
    - Pods offloaded into this cluster by a consumer count like any other: they hold the node for every
      other consumer. Only the offer to that consumer leaves them out (`offloaded_by`,
      `CapacityAggregate.used_for`).
    - A terminating pod (deletionTimestamp set) still counts: its containers run, and hold their
      resources, until the kubelet has stopped them and the pod is gone.
    """
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if not node or node in virtual_node_names:
        return False
    return (pod.get("status") or {}).get("phase") not in FINISHED_PHASES


def offloaded_by(pod: Obj, made_for: Mapping[str, str] | None = None) -> str | None:
    """The consumer that offloaded this pod here, or None: the one whose foreign namespace it runs in.

    The offer to that consumer leaves its own pods out: counting them made the advertised size change
    at every push in Liqo (PR 445) — a consumer's own pods would shrink the offer it then uses. Where a
    pod lives says whose it is, never what it says of itself: labels are written by whoever writes the
    pod, and a consumer labelling its copies `tidepool.io/consumer: b` would otherwise shrink what b's
    offer subtracts. Only the provider's tidepool makes the namespace, and a consumer's identity writes
    in its own namespace only.

    `made_for`: the namespaces the provider made for consumers' RemoteNamespaces (issue 35), by name, with
    the consumer each was made for (read off the labels only the provider's worker writes).
    """
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    return foreign_cluster_of_namespace(namespace) or (made_for or {}).get(namespace)


def spare(*, allocatable: Resources, used: Resources) -> Resources:
    """(allocatable − used), clamped at zero per resource. Clamped after subtracting, never before: Liqo
    clamped first and advertised negative memory. Only resources the nodes offer are spare: a request
    for a resource no node has (an extended resource of a deleted node) must not become a negative offer."""
    return (allocatable - used.only(allocatable)).clamp_at_zero()


def shared_resources(*, allocatable: Resources, used: Resources, percent: int) -> Resources:
    """`percent`% of the spare capacity, rounded down (Resources.scale)."""
    if not 0 <= percent <= 100:
        raise ValueError(f"percent must be between 0 and 100, got {percent}")
    return spare(allocatable=allocatable, used=used).scale(percent)


def capacity_changed(previous: Resources, current: Resources, threshold_percent: int) -> bool:
    """True when any resource moved by more than `threshold_percent` of its previous value, or
    appeared or vanished (a zero amount counts as absent)."""
    for name in set(previous) | set(current):
        before, after = previous.get_or_zero(name), current.get_or_zero(name)
        if before == 0 or after == 0:
            if before != after:
                return True
            continue
        if abs(after - before) * 100 > before * threshold_percent:
            return True
    return False


def _shift(into: _Amounts, amounts: Mapping[str, Decimal], sign: int) -> None:
    """Add (sign 1) or take back (sign -1) amounts in place, in the exact context. A resource whose
    total comes back to zero is dropped, so that totals do not carry "nvidia.com/gpu: 0" forever."""
    for name, value in amounts.items():
        total = into.get(name, Decimal(0)) + value if sign > 0 else into.get(name, Decimal(0)) - value
        if total:
            into[name] = total
        else:
            into.pop(name, None)


def _pod_key(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _check_event(event_type: str) -> None:
    if event_type not in ("ADDED", "MODIFIED", "DELETED"):
        raise ValueError(f"event_type must be ADDED, MODIFIED or DELETED, got {event_type!r}")


class CapacitySnapshot(BaseModel):
    """The aggregate's totals at one moment (what a push or the Web UI shows)."""

    model_config = ConfigDict(frozen=True)

    allocatable: Resources
    used: Resources
    physical_nodes: int
    virtual_nodes: int
    counted_pods: int
    # Physical nodes that take no other owner's pods (cordoned, tainted): neither their allocatable nor their
    # pods count.
    withheld_nodes: int = 0
    # What each consumer's offloaded pods hold on physical nodes (part of `used`), by consumer cluster id.
    offloaded: dict[str, Resources] = {}


def _shift_keyed(into: dict[str, _Amounts], key: str, amounts: Mapping[str, Decimal], sign: int) -> None:
    """`_shift` of one entry of a map of totals, dropping the entry when it comes back to nothing."""
    total = into.setdefault(key, {})
    _shift(total, amounts, sign)
    if not total:
        del into[key]


class PodHold(NamedTuple):
    """All the aggregate keeps of a pod: its key, and what it holds on which node for which consumer
    (`node` None: it holds nothing). kube/capacity.py turns each pod into one as its page is parsed, as
    client-go's transform does, so that a cluster's pods are never all in memory at once."""

    key: str
    node: str | None
    holds: _Amounts
    consumer: str | None


def pod_hold(pod: Obj, made_for: Mapping[str, str] | None = None) -> PodHold:
    key = _pod_key(pod)
    if not counts_against_capacity(pod):
        return PodHold(key, None, {}, None)
    with decimal.localcontext(_EXACT):
        holds = _pod_amounts(pod)
        _shift(holds, POD_SLOT, 1)
    # Whether its node is virtual is the node's business (apply_node), not the pod's.
    return PodHold(key, str((pod.get("spec") or {}).get("nodeName")), holds, offloaded_by(pod, made_for))


class CapacityAggregate:
    """Totals of allocatable (physical nodes) and used (pods that count, on physical nodes), and of what
    each consumer's offloaded pods hold among `used`, kept current from list and watch events.

    A pod counts when `counts_against_capacity` says so and its node is a known physical node: a pod
    bound to a node that is gone (or not listed yet) holds none of the allocatable summed here. Pods
    are summed per node (and per consumer on each node), so that a node turning virtual (or back, or
    being deleted) moves its pods in or out of the totals in one step, O(consumers × resources),
    whatever the number of pods. Every object remembers what it added, so that MODIFIED and DELETED
    take back exactly that: repeated events are idempotent and a pod leaving the count (Running →
    Succeeded) subtracts what it had added. Totals are plain dicts of exact Decimals changed in place
    (building a Resources per event would triple the cost of a relist of 100,000 pods); readers get
    Resources. Not thread-safe: kube/capacity.py holds a lock around it.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, _Amounts | None] = {}  # name -> allocatable if counted, None if virtual or withheld
        self._withheld: set[str] = set()  # physical nodes that take no other owner's pods
        # key -> (node name, what it holds, consumer that offloaded it or None); counted pods only
        self._pods: dict[str, PodHold] = {}
        self._by_node: dict[str, tuple[int, _Amounts]] = {}  # node name -> (pods, what they hold together)
        self._offloaded_by_node: dict[str, dict[str, _Amounts]] = {}  # node name -> consumer -> what it holds
        self._allocatable: _Amounts = {}
        self._used: _Amounts = {}
        self._offloaded: dict[str, _Amounts] = {}  # consumer -> what its pods hold on physical nodes
        self._physical = 0
        self._counted = 0  # counted pods on physical nodes

    @classmethod
    def from_lists(cls, nodes: Iterable[Obj], pods: Iterable[Obj]) -> CapacityAggregate:
        aggregate = cls()
        aggregate.reset_nodes(nodes)
        aggregate.reset_pods(pods)
        return aggregate

    def reset_nodes(self, nodes: Iterable[Obj]) -> None:
        """Replace every node with a fresh list (an informer's initial list or relist)."""
        self._nodes.clear()
        self._withheld.clear()
        self._allocatable, self._used, self._offloaded, self._physical, self._counted = {}, {}, {}, 0, 0
        for node in nodes:
            self.apply_node("ADDED", node)

    def reset_pods(self, pods: Iterable[Obj]) -> None:
        """Replace every pod with a fresh list (an informer's initial list or relist)."""
        self.reset_holds(pod_hold(pod) for pod in pods)

    def reset_holds(self, holds: Iterable[PodHold]) -> None:
        """`reset_pods` of pods already reduced by `pod_hold`."""
        self._pods.clear()
        self._by_node.clear()
        self._offloaded_by_node.clear()
        self._used, self._offloaded, self._counted = {}, {}, 0
        for hold in holds:
            self.apply_hold("ADDED", hold)

    def apply_node(self, event_type: str, node: Obj) -> None:
        _check_event(event_type)
        # Nodes by name: a node's name is what pods are bound to, and it is unique in a cluster.
        name = str((node.get("metadata") or {}).get("name", ""))
        pods_here, held_here = self._by_node.get(name, (0, {}))
        offloaded_here = self._offloaded_by_node.get(name, {})
        with decimal.localcontext(_EXACT):
            old = self._nodes.pop(name, None)
            if old is not None:
                _shift(self._allocatable, old, -1)
                self._move_pods_of_node(pods_here, held_here, offloaded_here, -1)
                self._physical -= 1
            self._withheld.discard(name)
            if event_type == "DELETED":
                return
            if not is_physical_node(node) or not takes_foreign_pods(node):
                self._nodes[name] = None
                if is_physical_node(node):
                    self._withheld.add(name)
                return
            allocatable = _node_amounts(node)
            self._nodes[name] = allocatable
            _shift(self._allocatable, allocatable, 1)
            self._move_pods_of_node(pods_here, held_here, offloaded_here, 1)
            self._physical += 1

    def _move_pods_of_node(self, pods: int, held: _Amounts, offloaded: Mapping[str, _Amounts], sign: int) -> None:
        _shift(self._used, held, sign)
        for consumer, amounts in offloaded.items():
            _shift_keyed(self._offloaded, consumer, amounts, sign)
        self._counted += sign * pods

    def apply_pod(self, event_type: str, pod: Obj) -> None:
        self.apply_hold(event_type, pod_hold(pod))

    def apply_hold(self, event_type: str, hold: PodHold) -> None:
        """`apply_pod` of a pod already reduced by `pod_hold`."""
        _check_event(event_type)
        with decimal.localcontext(_EXACT):
            old = self._pods.pop(hold.key, None)
            if old is not None and old.node is not None:
                self._hold(old.node, old.holds, old.consumer, sign=-1)
            if event_type == "DELETED" or hold.node is None:
                return
            self._pods[hold.key] = hold
            self._hold(hold.node, hold.holds, hold.consumer, sign=1)

    def _hold(self, node: str, holds: _Amounts, consumer: str | None, *, sign: int) -> None:
        pods_here, held_here = self._by_node.get(node, (0, {}))
        pods_here += sign
        _shift(held_here, holds, sign)
        if pods_here:
            self._by_node[node] = (pods_here, held_here)
        else:
            self._by_node.pop(node, None)
        if consumer is not None:
            offloaded_here = self._offloaded_by_node.setdefault(node, {})
            _shift_keyed(offloaded_here, consumer, holds, sign)
            if not offloaded_here:
                del self._offloaded_by_node[node]
        if self._nodes.get(node) is not None:  # a known physical node
            _shift(self._used, holds, sign)
            if consumer is not None:
                _shift_keyed(self._offloaded, consumer, holds, sign)
            self._counted += sign

    def allocatable(self) -> Resources:
        return Resources(self._allocatable)

    def used(self) -> Resources:
        """What every counted pod holds, offloaded ones included: the used capacity of a consumer that
        has offloaded nothing here."""
        return Resources(self._used)

    def used_for(self, consumer: str) -> Resources:
        """What the offer to `consumer` subtracts: everything running here except its own offloaded pods."""
        used = dict(self._used)
        with decimal.localcontext(_EXACT):
            _shift(used, self._offloaded.get(consumer, {}), -1)
        return Resources(used)

    def offloaded_by(self, consumer: str) -> Resources:
        """What `consumer`'s own offloaded pods hold here: running on its share, not subtracted from it."""
        return Resources(self._offloaded.get(consumer, {}))

    def snapshot(self) -> CapacitySnapshot:
        return CapacitySnapshot(
            allocatable=self.allocatable(),
            used=self.used(),
            physical_nodes=self._physical,
            virtual_nodes=len(self._nodes) - self._physical - len(self._withheld),
            counted_pods=self._counted,
            withheld_nodes=len(self._withheld),
            offloaded={consumer: Resources(amounts) for consumer, amounts in self._offloaded.items()},
        )
