"""A super cluster's health: what the pool's prober (workers/pool_health.py) concludes from its probes and
writes on the SuperCluster's status, and what a scheduling pass (activities/pool.py) reads back. The
status is the one record: `kubectl get superclusters` shows it, the pass never probes on its own, and a
restarted prober keeps counting the grace period from `status.failingSince`.

A probe lists the cluster's nodes and counts the physical ones that are Ready and take tenant pods
(`probe_of_nodes`): a virtual node of a peering is another cluster's capacity, which that cluster counts
already. A probe fails when the API server does not answer (or refuses the credentials) and when no physical
node is Ready and schedulable: either way nothing new can run there of its own. States:
- Unknown: never probed yet. Keeps its slices; takes no new ones (its capacity is not known).
- Ready: the last probe succeeded. Keeps and takes slices.
- Suspect: failing for less than the grace period. A blip: keeps its slices, takes no new ones.
- Unreachable: failing for the grace period or longer. Its slices move elsewhere (a saga: nothing is
  removed from it before the replacement runs).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

from models.api.conditions import ConditionValue, SuperClusterReadyReason, condition
from models.resources import Resources
from models.sharing import is_physical_node, node_allocatable, takes_foreign_pods
from models.times import format_rfc3339, parse_rfc3339

HealthState = Literal["Unknown", "Ready", "Suspect", "Unreachable"]


def accepts_slices(state: HealthState) -> bool:
    """Whether new slices may be placed on a cluster in this state."""
    return state == "Ready"


def drains(state: HealthState) -> bool:
    """Whether the slices placed on a cluster in this state move elsewhere (a mandatory placement waits)."""
    return state == "Unreachable"


@dataclass(frozen=True)
class ProbeOutcome:
    """One probe: `failure` is None when the API answered with at least one Ready, schedulable physical node;
    otherwise why not, in words fit for a status (never an exception's text with headers or bodies)."""

    allocatable: Resources
    failure: str | None = None
    no_ready_node: bool = False  # the API answered, but no node can run a pod


NO_PHYSICAL_NODE = "no Ready, schedulable physical node"
CAPACITY_RESOURCES = ("cpu", "memory")  # what slices are cut from (models/pool/slicing.py: SLICED)


def probe_of_nodes(nodes: Iterable[dict[str, Any]], *, tolerated: Collection[str] = ()) -> ProbeOutcome:
    """A probe that listed `nodes` (as the API server serves them): the allocatable of the physical nodes
    that are Ready and take tenant pods (not cordoned, no NoSchedule or NoExecute taint but of a `tolerated`
    key: the SuperCluster's spec.tolerations.allowed, the only tolerations tenant pods keep there). A super
    cluster that peers out gets virtual nodes with the capacity of its providers, which are super clusters
    of the pool too, or not ours to promise: counting them would promise it twice."""
    allocatable = Resources()
    for node in nodes:
        status = node.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        if ready and takes_foreign_pods(node, tolerated=tolerated) and is_physical_node(node):
            allocatable = allocatable + node_allocatable(node).only(CAPACITY_RESOURCES)
    if not allocatable:
        return ProbeOutcome(allocatable, failure=NO_PHYSICAL_NODE, no_ready_node=True)
    return ProbeOutcome(allocatable)


@dataclass(frozen=True)
class Health:
    state: HealthState
    reason: SuperClusterReadyReason | None  # None while Unknown
    message: str
    allocatable: Resources  # of Ready, schedulable physical nodes at the last successful probe
    failing_since: datetime | None = None

    @property
    def accepts_slices(self) -> bool:
        return accepts_slices(self.state)

    @property
    def drains(self) -> bool:
        return drains(self.state)

    @property
    def summary(self) -> str:
        """One line for the pool scheduler's details: state, reason and message."""
        return f"{self.state} ({self.reason}): {self.message}" if self.reason else f"{self.state}: {self.message}"

    def condition(self) -> ConditionValue | None:
        if self.reason is None:
            return None
        return condition("Ready", self.state in ("Ready", "Suspect"), self.reason, self.message)

    def status(self) -> dict[str, Any]:
        """The SuperCluster status fields the prober owns, as a merge patch (None clears a field)."""
        return {"allocatable": self.allocatable.to_kubernetes(),
                "failingSince": format_rfc3339(self.failing_since) if self.failing_since else None}  # fmt: skip


UNKNOWN = Health("Unknown", None, "not probed yet", Resources())


def next_health(previous: Health, outcome: ProbeOutcome, *, now: datetime, grace: timedelta) -> Health:
    """The health after one probe. A failing cluster keeps the allocatable of its last good probe (its
    slices are still held there); the message names no time or count, so a failure that goes on
    writes nothing new until it crosses the grace period."""
    if outcome.failure is None:
        return Health("Ready", "ProbeSucceeded", "probes succeed", outcome.allocatable)
    since = previous.failing_since or now
    if now - since < grace:
        message = f"probe failing, within the grace period of {int(grace.total_seconds())} s: {outcome.failure}"
        return Health("Suspect", "ProbeFailing", message, previous.allocatable, since)
    reason: SuperClusterReadyReason = "NoReadyNode" if outcome.no_ready_node else "Unreachable"
    message = f"probes failing since {format_rfc3339(since)}: {outcome.failure}"
    return Health("Unreachable", reason, message, previous.allocatable, since)


def health_from_status(status: dict[str, Any] | None) -> Health:
    """The health a SuperCluster's status records (the prober's last write); Unknown without one."""
    status = status or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready is None:
        return UNKNOWN
    allocatable = Resources(status.get("allocatable") or {})
    since = parse_rfc3339(status.get("failingSince"))
    reason = ready.get("reason")
    if reason not in get_args(SuperClusterReadyReason):
        return UNKNOWN  # not the prober's write
    state: HealthState = ("Ready" if reason == "ProbeSucceeded" else "Suspect" if reason == "ProbeFailing"
                          else "Unreachable")  # fmt: skip
    return Health(state, reason, ready.get("message") or "", allocatable, since)
