"""Moving a namespace's slices off super clusters is a saga, not a delete: pure decisions that
activities/pool.py applies and workflows/pool.py sequences (the pass places and drains, `move_pods`,
`finish_move`). Every step's state lives in annotations, so a worker killed mid-move resumes where the
annotations say.

1. Drain. When a namespace's placement changes (its cluster Unreachable past the grace period, removed
   from the pool, a quota shrunk, a placement edited or cleared), the pass writes the new placement and
   `pool.tidepool.io/draining: {old cluster: slices}` in the same patch. The namespace holds placement +
   draining until the move ends: the old cluster is not overcommitted meanwhile. The previous placement
   is what the scheduler last wrote (SCHEDULED), which a user's edit or clear does not touch.
2. Move pods. A live pod annotated to a cluster outside the placement is re-placed (choose_cluster rules)
   and annotated with its new cluster and `moved-from: <old>`; its tenant status turns Pending (reason
   Recreating), so that Running afterwards is the new copy's. The old cluster's syncer keeps its copy and
   pushes none of its status. A pod that fits nowhere stays (its copy untouched) and says why.
3. Finish. Once no live pod is left on a draining cluster outside the placement and every pod moved from
   it runs (or ended), moved-from is cleared on its pods and the cluster leaves `draining`; its syncer then
   deletes the namespace there, at once if it answers, when it comes back if not.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from models.api.conditions import POD_SUPER_CLUSTER_CONDITION, ConditionValue, condition
from models.names import DRAINING_ANNOTATION, PLACEMENTS_ANNOTATION, SCHEDULED_ANNOTATION
from models.pool.namespaces import placement_of
from models.sharing import FINISHED_PHASES


def draining_of(annotations: Mapping[str, str]) -> dict[str, int]:
    """The draining annotation as slice counts; garbage reads as nothing (no capacity held, no move)."""
    try:
        value = json.loads(annotations.get(DRAINING_ANNOTATION) or "{}")
    except json.JSONDecodeError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}


def scheduled_of(annotations: Mapping[str, str]) -> dict[str, int]:
    """The placement the scheduler last wrote, read as a placement: where the namespace's pods run until a
    move says otherwise (a user's edit or clear does not change it)."""
    return placement_of({PLACEMENTS_ANNOTATION: annotations.get(SCHEDULED_ANNOTATION, "")})


def holding(placement: Mapping[str, int], draining: Mapping[str, int]) -> dict[str, int]:
    """The slices a namespace holds per cluster: its placement and what still drains."""
    return {c: placement.get(c, 0) + draining.get(c, 0) for c in sorted({*placement, *draining})}


def drain_after(*, previous: Mapping[str, int], placement: Mapping[str, int],
                draining: Mapping[str, int]) -> dict[str, int]:  # fmt: skip
    """The draining annotation after a new placement: what drained already, plus every slice the new
    placement no longer holds on a cluster of the previous one."""
    result = dict(draining)
    for cluster, count in previous.items():
        dropped = count - placement.get(cluster, 0)
        if dropped > 0:
            result[cluster] = result.get(cluster, 0) + dropped
    return dict(sorted(result.items()))


@dataclass(frozen=True)
class PodView:
    """What the saga reads of a tenant pod."""

    name: str
    cluster: str | None  # POD_CLUSTER_ANNOTATION
    moved_from: str | None  # MOVED_FROM_ANNOTATION
    phase: str | None
    deleting: bool = False

    @property
    def live(self) -> bool:
        """Whether it still runs, or will: an ended or deleted pod needs no move."""
        return self.phase not in FINISHED_PHASES and not self.deleting


def moved_from(pod: PodView, *, new: str) -> str | None:
    """The cluster whose copy keeps running while `pod` moves to `new`: the one it runs on now if its
    copy there runs (a second move), else the one it first left (its copy there never ran); none when it
    goes back to that very cluster (whose syncer then owns it again)."""
    keeps = pod.cluster if pod.phase == "Running" or pod.moved_from is None else pod.moved_from
    return None if keeps == new else keeps


def must_move(pod: PodView, placement: Mapping[str, int]) -> bool:
    """A live pod placed on a cluster its namespace's placement no longer names."""
    return pod.live and pod.cluster is not None and placement.get(pod.cluster, 0) <= 0


def finished_clusters(*, draining: Mapping[str, int], placement: Mapping[str, int],
                      pods: Iterable[PodView]) -> list[str]:  # fmt: skip
    """The draining clusters whose move is over: no live pod left there that must move, and every pod
    moved from there Running (or ended)."""
    busy: set[str] = set()
    for pod in pods:
        if must_move(pod, placement):
            busy.add(pod.cluster or "")
        if pod.moved_from is not None and pod.live and pod.phase != "Running":
            busy.add(pod.moved_from)
    return sorted(c for c in draining if c not in busy)


def _condition_dict(value: ConditionValue, now: str) -> dict[str, Any]:
    # Strategic merge on a pod's conditions is keyed by type: only the conditions written here change.
    return {"type": value.type, "status": "True" if value.status else "False", "reason": value.reason,
            "message": value.message, "lastTransitionTime": now}  # fmt: skip


def recreating_status(*, old: str, new: str, now: str) -> dict[str, Any]:
    """The tenant pod's status while it is recreated on `new`: Pending, not Ready, no container or IP of the
    old copy (a strategic merge would add the new copy's IPs to the old ones); the new cluster's syncer
    pushes the new copy's status (without a reason, which clears ours)."""
    message = f"being recreated on super cluster {new}: its slices left {old}"
    conditions = [condition("Ready", False, "Recreating", message),
                  condition(POD_SUPER_CLUSTER_CONDITION, False, "Recreating", message)]  # fmt: skip
    return {"phase": "Pending", "reason": "Recreating", "message": message, "containerStatuses": None,
            "initContainerStatuses": None, "podIP": None, "podIPs": None,
            "conditions": [_condition_dict(c, now) for c in conditions]}  # fmt: skip


def unreachable_status(*, cluster: str, why: str, now: str) -> dict[str, Any]:
    """A pod left on an Unreachable cluster (it fits nowhere else): its phase is the last one seen."""
    message = f"super cluster {cluster} is unreachable; the pod fits in no other super cluster of its namespace: {why}"
    value = condition(POD_SUPER_CLUSTER_CONDITION, False, "SuperClusterUnreachable", message)
    return {"reason": "SuperClusterUnreachable", "message": message, "conditions": [_condition_dict(value, now)]}


def ready_again_status(*, cluster: str, now: str) -> dict[str, Any]:
    """The condition once the pod's cluster runs it again (the syncer's next push clears the reason)."""
    value = condition(POD_SUPER_CLUSTER_CONDITION, True, "SuperClusterReady", f"super cluster {cluster} runs the pod")
    return {"conditions": [_condition_dict(value, now)]}


def refused_status(*, cluster: str, why: str, now: str) -> dict[str, Any]:
    """A pod its super cluster's API server refuses (its Pod Security level, models/pool/sync.py): Pending,
    and why, as the super cluster said it (`kubectl get pod` shows the reason, `describe` the message)."""
    message = f"super cluster {cluster} refuses it: {why}"[:1024]
    value = condition("PodScheduled", False, "SuperClusterRefused", message)
    return {"phase": "Pending", "reason": "SuperClusterRefused", "message": message,
            "conditions": [_condition_dict(value, now)]}  # fmt: skip


def unschedulable_status(*, why: str, now: str) -> dict[str, Any]:
    """A pod that never ran and fits in none of its namespace's clusters: Pending, as the scheduler says."""
    value = condition("PodScheduled", False, "Unschedulable", f"fits in no super cluster of its namespace: {why}")
    return {"phase": "Pending", "conditions": [_condition_dict(value, now)]}
