"""A tenant namespace's placement decision, pure: activities/pool.py reads the namespace's annotations
and quotas, calls `decide_namespace`, and writes what it returns.

Annotations on a tenant namespace: the slice (the user's), the policy (the user's, overriding the pool's),
the placement (ours, or edited by a user), what the scheduler last wrote (to tell an edit from its own
write), the user's placement the scheduler honours (mandatory until the user clears or edits it), the
slice the placement was made with (a changed slice is refused), and a status saying why it is not placed.
The rules, in the order of the code:
1. The slice must parse and divide the quota (models/pool/slicing.py), else InvalidSlice. Without the slice
   annotation the slice is the default, adapted to the quota (models/pool/slicing.py: default_slice_for).
2. A placed namespace whose slice changed, or whose placed slice cannot be read, is refused
   (InvalidSlice): moving slices of another size would overcommit; clearing the placement reschedules
   it with the new slice.
3. The policy annotation, when present, must be spread or pack, else InvalidPolicy; absent, the pool's
   (ClusterConfig spec.pool.policy).
4. A mandatory placement (a user's edit, new or honoured before) that names an Unreachable cluster waits
   for it (WaitingForCluster): it is never moved silently; clearing or editing the placement moves it.
5. Placed, as we wrote it, with the right count on clusters that do not drain, and its status says so:
   kept, nothing written. (A refusal that ended, such as a mandatory cluster back, rewrites the status.)
6. Otherwise placed anew (models/pool/placement.py): the mandatory entries are kept, our own previous
   placement is a hint; no room is InsufficientCapacity (with the default slice, naming the annotation that
   sets a smaller one), and nothing partial is written. A changed policy moves nothing placed: it decides
   where new slices go.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from models.api.conditions import ConditionValue, PlacedReason, condition
from models.names import (
    MANDATORY_ANNOTATION,
    PLACED_SLICE_ANNOTATION,
    PLACEMENT_STATUS_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    POLICY_ANNOTATION,
    SCHEDULED_ANNOTATION,
    SLICE_ANNOTATION,
)
from models.pool.placement import HEALTH_REJECTIONS, ClusterSnapshot, PlacementRequest, Policy, schedule
from models.pool.result import PoolNamespaceEntry
from models.pool.slicing import SliceError, has_slice_annotation, namespace_quota, namespace_slices, parse_slice
from models.resources import Resources

SYSTEM_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease", "tidepool-system"})
# A field selector for what a tenant keeps outside those: what the pool's watchers of tenant objects list.
OUTSIDE_SYSTEM_NAMESPACES = ",".join(f"metadata.namespace!={ns}" for ns in sorted(SYSTEM_NAMESPACES))

# Who wrote the placement annotation: nobody (never placed, or cleared: schedule everything), the
# scheduler (its value equals the scheduled one), or a user who edited it (kept as mandatory).
PlacementAuthor = Literal["Nobody", "Scheduler", "User"]
# Whether the slice a namespace asks for is the one its placement holds.
SliceChange = Literal["NotPlaced", "Unchanged", "Changed"]


def _json(text: str | None) -> dict[str, Any] | None:
    try:
        value = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _counts(value: dict[str, Any] | None) -> dict[str, int]:
    return {str(k): int(v) for k, v in (value or {}).items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}


def placement_of(annotations: Mapping[str, str]) -> dict[str, int]:
    """The placement annotation as slice counts; garbage and non-positive counts read as nothing."""
    return _counts(_json(annotations.get(PLACEMENTS_ANNOTATION)))


POLICIES: dict[str, Policy] = {"spread": "spread", "pack": "pack"}


def namespace_policy(annotation: str | None, *, pool: Policy) -> Policy | None:
    """The policy annotation's, else the pool's; None when the annotation names no policy."""
    if annotation is None or not annotation.strip():
        return pool
    return POLICIES.get(annotation.strip())


def mandatory_of(annotations: Mapping[str, str], *, author: PlacementAuthor) -> dict[str, int]:
    """The entries a user chose: a new edit's, else the ones the scheduler honoured before (none once the
    placement is cleared)."""
    if author == "User":
        return placement_of(annotations)
    if author == "Scheduler":
        return _counts(_json(annotations.get(MANDATORY_ANNOTATION)))
    return {}


def mandatory_annotation(decision: Place) -> str | None:
    """The mandatory annotation a Place writes: None removes it (nothing the user chose)."""
    return json.dumps(decision.mandatory, sort_keys=True) if decision.mandatory else None


def placement_author(*, current: Mapping[str, int], scheduled: Mapping[str, int]) -> PlacementAuthor:
    """The scheduler writes its placement and what it scheduled together (equal): only a placement that
    differs from the scheduled one is a user's edit."""
    if not current:
        return "Nobody"
    return "Scheduler" if current == scheduled else "User"


def slice_change(*, current: Mapping[str, int], placed_slice: Resources | None, slice_: Resources) -> SliceChange:
    """A placement made before the placed-slice annotation existed has no placed slice: unchanged."""
    if not current or placed_slice is None:
        return "NotPlaced" if not current else "Unchanged"
    return "Unchanged" if placed_slice == slice_ else "Changed"


def placed_slice_of(annotations: Mapping[str, str]) -> Resources | None:
    """The slice the placement was made with; None when absent (placed before the annotation existed).
    Raises SliceError for garbage: nobody can tell whether the slice changed."""
    text = annotations.get(PLACED_SLICE_ANNOTATION)
    if text is None or not text.strip():
        return None
    try:
        return parse_slice(text)
    except SliceError as e:
        raise SliceError(f"the {PLACED_SLICE_ANNOTATION} annotation cannot be read ({e}); clear the placement to "
                         "reschedule") from e  # fmt: skip


def held_slice(annotations: Mapping[str, str]) -> Resources | None:
    """The slice a namespace's placement holds: the one it was placed with, else the one it asks for;
    None for garbage, which holds no capacity (its own decision reports it)."""
    try:
        return placed_slice_of(annotations) or parse_slice(annotations.get(SLICE_ANNOTATION))
    except SliceError:
        return None


def held_by_others(cluster: str, namespace: str, held: Mapping[str, Mapping[str, int]],
                   slices: Mapping[str, Resources]) -> Resources:  # fmt: skip
    """What the other namespaces' slices hold on `cluster`."""
    total = Resources()
    for other, placement in held.items():
        if other != namespace and placement.get(cluster) and other in slices:
            total = total + Resources({k: v * placement[cluster] for k, v in slices[other].items()})
    return total


@dataclass(frozen=True)
class Keep:
    """Nothing is written: placed, and nothing moved (the common case); or not placed while a cluster that
    has not been probed yet might take it."""


@dataclass(frozen=True)
class Refuse:
    reason: Literal["InvalidSlice", "InsufficientCapacity", "InvalidPolicy", "WaitingForCluster"]
    message: str
    diagnosis: dict[str, str]


@dataclass(frozen=True)
class Place:
    placement: dict[str, int]
    slice: Resources
    count: int
    message: str
    diagnosis: dict[str, str]
    mandatory: dict[str, int] = field(default_factory=dict)  # the user's entries it honours


NamespaceDecision = Keep | Refuse | Place


def requested_slices(annotations: Mapping[str, str], hards: Iterable[Mapping[str, Any]]) -> tuple[Resources, int]:
    """The slice a namespace asks for and how many of them its quota makes. Raises SliceError."""
    annotation = annotations.get(SLICE_ANNOTATION)
    # Only the default slice depends on the placed one; an annotated slice is checked first.
    placed_default = placed_slice_of(annotations) if placement_of(annotations) and not has_slice_annotation(annotation) else None
    return namespace_slices(annotation=annotation, quota=namespace_quota(hards), placed=placed_default)


def live_entry(name: str, annotations: Mapping[str, str], hards: Iterable[Mapping[str, Any]],
               decision: NamespaceDecision, placement: Mapping[str, int]) -> PoolNamespaceEntry:  # fmt: skip
    """What `tidepool simulate pool` replays of one namespace in one pass: what it asked for, what a user
    chose for it (an edit, a clear), its own policy, and its placement as the pass left it (`placement`). A
    refusal no policy would change (InvalidSlice, InvalidPolicy, WaitingForCluster) is kept as its reason,
    with the slice its placement still holds."""
    current, scheduled = placement_of(annotations), _counts(_json(annotations.get(SCHEDULED_ANNOTATION)))
    author = placement_author(current=current, scheduled=scheduled)
    entry = PoolNamespaceEntry(namespace=name, placement=dict(placement), policy=annotations.get(POLICY_ANNOTATION),
                               edit=dict(current) if author == "User" else {}, cleared=not current and bool(scheduled))  # fmt: skip
    if isinstance(decision, Refuse) and decision.reason != "InsufficientCapacity":
        held = held_slice(annotations)  # what its placement still holds
        entry.refused, entry.slice = decision.reason, held.to_kubernetes() if held is not None else {}
        return entry
    if isinstance(decision, Place):
        slice_, count, mandatory = decision.slice, decision.count, decision.mandatory
    else:
        slice_, count = requested_slices(annotations, hards)  # it parsed in decide_namespace
        mandatory = mandatory_of(annotations, author=author)
    entry.slice, entry.slices, entry.mandatory = slice_.to_kubernetes(), count, dict(mandatory)
    return entry


def decide_namespace(*, name: str, annotations: Mapping[str, str], hards: Iterable[Mapping[str, Any]],
                     clusters: list[ClusterSnapshot], held: Mapping[str, Mapping[str, int]],
                     slices: Mapping[str, Resources], pool_policy: Policy) -> NamespaceDecision:  # fmt: skip
    """`clusters` as they are, without what namespaces hold; `held` and `slices`: every namespace's
    placement and slice as they stand in this pass; `pool_policy`: ClusterConfig spec.pool.policy."""
    current = placement_of(annotations)
    scheduled = _counts(_json(annotations.get(SCHEDULED_ANNOTATION)))
    annotation = annotations.get(SLICE_ANNOTATION)
    try:
        slice_, count = requested_slices(annotations, hards)
    except SliceError as e:
        return Refuse("InvalidSlice", str(e), {})
    try:
        placed_slice = placed_slice_of(annotations) if current else None  # unplaced: the next Place rewrites it
    except SliceError as e:
        return Refuse("InvalidSlice", str(e), {})
    if slice_change(current=current, placed_slice=placed_slice, slice_=slice_) == "Changed":
        assert placed_slice is not None  # "Changed" compares two slices
        return Refuse("InvalidSlice", f"the slice changed from {placed_slice.to_kubernetes()} to "
                                      f"{slice_.to_kubernetes()} after placement; clear the placement to reschedule",
                      {})  # fmt: skip
    policy = namespace_policy(annotations.get(POLICY_ANNOTATION), pool=pool_policy)
    if policy is None:
        return Refuse("InvalidPolicy", f"the {POLICY_ANNOTATION} annotation must be spread or pack (or absent: the "
                                       f"pool's policy), got {annotations[POLICY_ANNOTATION]!r}", {})  # fmt: skip
    author = placement_author(current=current, scheduled=scheduled)
    mandatory = mandatory_of(annotations, author=author)
    waiting_for = sorted(c.name for c in clusters if c.drains and mandatory.get(c.name))
    if waiting_for:
        return Refuse("WaitingForCluster", f"the placement a user chose names {', '.join(waiting_for)}, unreachable: "
                                           f"waiting for it (clear or edit the {PLACEMENTS_ANNOTATION} annotation to "
                                           "place the namespace elsewhere)",
                      {c: str(HEALTH_REJECTIONS["Unreachable"]) for c in waiting_for})  # fmt: skip
    staying = {c.name for c in clusters if not c.drains}
    said = previous_reason(annotations.get(PLACEMENT_STATUS_ANNOTATION)) in (None, "Scheduled")
    if author == "Scheduler" and sum(current.values()) == count and set(current) <= staying and said:
        return Keep()
    snapshot = [ClusterSnapshot(c.name, c.health, c.allocatable, c.headroom, held_by_others(c.name, name, held, slices))
                for c in clusters]  # fmt: skip
    request = PlacementRequest(namespace=name, slice=slice_, count=count, policy=policy, mandatory=mandatory,
                               previous={} if author == "User" else current)  # fmt: skip
    outcome = schedule(request, snapshot)
    if outcome.placement is None and any(c.health == "Unknown" for c in clusters):
        # Not refused yet: a cluster not probed may have the room, and its first probe brings another pass (a
        # worker's first pass often runs before its prober's first probe).
        return Keep()
    if outcome.placement is None:
        message = outcome.message
        if not has_slice_annotation(annotation):  # slices of a size the user chose could fit where these do not
            default = json.dumps(slice_.to_kubernetes(), sort_keys=True)
            message += f" (the default slice, {default}; a smaller one in the {SLICE_ANNOTATION} annotation may fit)"
        return Refuse("InsufficientCapacity", message, outcome.diagnosis)
    return Place(outcome.placement, slice_, count, outcome.message, outcome.diagnosis, mandatory)


def placed_condition(decision: Place | Refuse) -> ConditionValue:
    reason: PlacedReason = "Scheduled" if isinstance(decision, Place) else decision.reason
    return condition("Placed", isinstance(decision, Place), reason, decision.message)


def placement_status(decision: Place | Refuse) -> str:
    """The placement-status annotation: the Placed condition (namespaces have no status of ours), with
    the reason per cluster when not placed. Its JSON is what the scheduler has always written."""
    value = placed_condition(decision)
    status = {"type": value.type, "status": "True" if value.status else "False", "reason": value.reason,
              "message": value.message}  # fmt: skip
    if isinstance(decision, Place):
        return json.dumps(status)
    return json.dumps({**status, "clusters": decision.diagnosis}, sort_keys=True)


def previous_reason(status: str | None) -> str | None:
    """The reason of a placement-status annotation as written before (None when absent or garbage)."""
    reason = (_json(status) or {}).get("reason")
    return reason if isinstance(reason, str) else None
