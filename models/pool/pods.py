"""Pod placement: a tenant pod goes to one cluster of its namespace's placement, where the slices placed
there still hold its requests. Pods are placed once and never moved."""

from __future__ import annotations

from dataclasses import dataclass

from models.resources import Resources


@dataclass(frozen=True)
class PodPlacement:
    cluster: str | None
    reasons: dict[str, str]  # cluster -> why not, when none fits


def choose_cluster(
    *, requests: Resources, placement: dict[str, int], slice_: Resources, used: dict[str, Resources]
) -> PodPlacement:
    """The cluster with the most room left for this namespace (ties by name)."""
    room: dict[str, Resources] = {}
    reasons: dict[str, str] = {}
    for cluster, count in sorted(placement.items()):
        share = Resources({k: v * count for k, v in slice_.items()})
        free = share - used.get(cluster, Resources())
        short = requests.only(slice_).shortfall(free)
        if short:
            reasons[cluster] = f"InsufficientQuota: short of {short.to_kubernetes()} in the slices placed here"
        else:
            room[cluster] = free
    if not room:
        return PodPlacement(None, reasons or {"*": "NotPlaced: the namespace has no placement yet"})
    best = min(room, key=lambda c: (-sum(v / slice_[k] for k, v in room[c].items() if k in slice_ and slice_[k]), c))
    return PodPlacement(best, {})


@dataclass(frozen=True)
class WaitingPod:
    name: str
    requests: Resources


def place_waiting(waiting: list[WaitingPod], *, placement: dict[str, int], slice_: Resources,
                  used: dict[str, Resources]) -> dict[str, PodPlacement]:  # fmt: skip
    """Each waiting pod of one namespace, in the order given (oldest first), to the cluster `choose_cluster`
    picks with the pods before it counted: the one rule of the scheduling pass and of the pod placer
    (workers/pod_placer.py). `used`: what the namespace's placed, live pods hold per cluster."""
    used = dict(used)
    chosen: dict[str, PodPlacement] = {}
    for pod in waiting:
        choice = chosen[pod.name] = choose_cluster(requests=pod.requests, placement=placement, slice_=slice_,
                                                   used={c: used.get(c, Resources()) for c in placement})  # fmt: skip
        if choice.cluster is not None:
            used[choice.cluster] = used.get(choice.cluster, Resources()) + pod.requests
    return chosen
