"""What of the tenant control plane's objects a scheduling pass (activities/pool.py) reads, as keys the
pool's watchers (workers/pool.py) compare: the scheduler is signalled only when a key changes, appears
or goes. New pods (the pod placer's), status churn (a pod's conditions, a ResourceQuota's status.used, which moves with every pod),
heartbeats and resourceVersion bumps change no key; neither do the scheduler's own writes.

The memory of the keys is kube/keys.py (KeyMemory, by namespace and name). A super cluster's nodes live
in another cluster: the pool's prober records their allocatable and health on the SuperCluster's status,
which is watched here.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from typing import Any

from models.names import (
    MOVED_FROM_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    POLICY_ANNOTATION,
    SCHEDULED_ANNOTATION,
    SLICE_ANNOTATION,
)
from models.pool.health import health_from_status
from models.sharing import FINISHED_PHASES

Obj = dict[str, Any]


def _meta(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


def namespace_key(obj: Obj) -> Hashable:
    """The slice, the policy, a placement the user edited, and whether it is going. The scheduler writes its placement
    and what it scheduled together (equal): only a placement that differs from the scheduled one is a
    user's edit (or a cleared one, which reschedules)."""
    meta = _meta(obj)
    annotations = meta.get("annotations") or {}
    placements = annotations.get(PLACEMENTS_ANNOTATION)
    edited = (placements,) if placements != annotations.get(SCHEDULED_ANNOTATION) else None  # (None,): cleared
    return (meta.get("uid"), annotations.get(SLICE_ANNOTATION), annotations.get(POLICY_ANNOTATION), edited,
            bool(meta.get("deletionTimestamp")))  # fmt: skip


def quota_key(obj: Obj) -> Hashable:
    """spec.hard only: status.used moves with every pod and decides nothing."""
    hard = (obj.get("spec") or {}).get("hard") or {}
    return _meta(obj).get("uid"), tuple(sorted((str(k), str(v)) for k, v in hard.items()))


def pod_key(obj: Obj) -> Hashable | None:
    """What a pass decides on of a pod: that it stopped holding its namespace's capacity (it ended or is being
    deleted), and, for a pod being moved (models/pool/moves.py), whether its new copy runs yet: that is what
    finishes the move. A live pod not being moved has no key (None): its arrival, placement and status are
    the pod placer's (workers/pod_placer.py), and a pass leaves a young pod to it (activities/pool.py placers_since): a
    burst of ten thousand pods is no reason for passes that each read every pod. The placement annotation
    is the scheduler's own write; a moved pod's status otherwise is churn."""
    meta = _meta(obj)
    phase = (obj.get("status") or {}).get("phase")
    done = phase in FINISHED_PHASES or bool(meta.get("deletionTimestamp"))
    moving = bool((meta.get("annotations") or {}).get(MOVED_FROM_ANNOTATION)) and not done and phase != "Running"
    return (meta.get("uid"), done, moving) if done or moving else None


def super_cluster_key(obj: Obj) -> Hashable:
    """The spec (credentials reference, headroom) and what the pass reads of the prober's status: the
    health state and the allocatable. A message that only says more of the same failure is no change."""
    health = health_from_status(obj.get("status"))
    return (_meta(obj).get("uid"), json.dumps(obj.get("spec") or {}, sort_keys=True), health.state,
            json.dumps(health.allocatable.to_kubernetes(), sort_keys=True))  # fmt: skip


def pool_config_key(obj: Obj) -> Hashable:
    """ClusterConfig spec.pool: the policy and headroom a pass reads (the prober reads the rest itself)."""
    return _meta(obj).get("uid"), json.dumps((obj.get("spec") or {}).get("pool") or {}, sort_keys=True)
