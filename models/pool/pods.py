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
