"""Namespace placement: where a namespace's quota slices go, as filter and score steps over an immutable
snapshot of the super clusters (Karmada's shape), keeping a reason for every cluster it did not use.

Deterministic, and better than virtualcluster's first fit over a Go map: `spread` balances the free
share of the clusters, `pack` fills the fullest cluster that still fits (fewest clusters). A user-edited
placement is kept as mandatory (capped to the slice count), the previous placement is kept where it
still fits, and nothing partial is ever returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from models.resources import Resources

Policy = Literal["spread", "pack"]


@dataclass(frozen=True)
class ClusterSnapshot:
    name: str
    ready: bool
    allocatable: Resources  # of its Ready nodes
    headroom: Resources
    placed: Resources  # what other namespaces' slices hold there

    @property
    def capacity(self) -> Resources:
        return (self.allocatable - self.headroom).clamp_at_zero()


@dataclass(frozen=True)
class PlacementRequest:
    namespace: str
    slice: Resources
    count: int
    policy: Policy = "spread"
    mandatory: dict[str, int] = field(default_factory=dict)  # entries a user wrote: kept
    previous: dict[str, int] = field(default_factory=dict)  # the last placement: kept where it still fits


@dataclass(frozen=True)
class PlacementResult:
    placement: dict[str, int] | None  # None: not placed, and nothing written
    diagnosis: dict[str, str]  # cluster -> why it got no (more) slices
    message: str


def _fits(cluster: ClusterSnapshot, slice_: Resources, count: int) -> bool:
    needed = cluster.placed + Resources({k: v * count for k, v in slice_.items()})
    return needed.fits_in(cluster.capacity)


def _free_slices(cluster: ClusterSnapshot, slice_: Resources) -> int:
    free = (cluster.capacity - cluster.placed).clamp_at_zero()
    return int(min((free.get_or_zero(name) // size for name, size in slice_.items() if size > 0), default=0))


def schedule(request: PlacementRequest, clusters: list[ClusterSnapshot]) -> PlacementResult:
    by_name = {c.name: c for c in sorted(clusters, key=lambda c: c.name)}
    diagnosis: dict[str, str] = {}
    usable: dict[str, ClusterSnapshot] = {}
    for name, cluster in by_name.items():  # filter
        if not cluster.ready:
            diagnosis[name] = "NotReady: the cluster has no Ready nodes or is marked not ready"
        else:
            usable[name] = cluster
    for name in {*request.mandatory, *request.previous} - set(by_name):
        diagnosis[name] = "Unknown: no such super cluster (removed from the pool); its slices move elsewhere"

    placement: dict[str, int] = {}
    remaining = request.count
    for name, wanted in sorted(request.mandatory.items()):  # the user's entries, capped to the total
        take = min(wanted, remaining)
        if take <= 0 or name not in usable:
            continue
        if not _fits(usable[name], request.slice, take):
            return PlacementResult(None, {**diagnosis, name: "InsufficientCapacity: cannot hold the slices the "
                                          f"placement annotation asks for ({take})"},
                                   f"the edited placement asks {name} for {take} slices, which do not fit")  # fmt: skip
        placement[name], remaining = take, remaining - take
    def keep_first(item: tuple[str, int]) -> tuple[object, ...]:
        """When the quota shrank, which slices stay: pack keeps the biggest holdings, spread the roomiest."""
        name, had = item
        if request.policy == "pack":
            return (-had, name)
        return (-_free_slices(usable[name], request.slice) if name in usable else 0, name)

    keep_order = sorted(request.previous.items(), key=keep_first)
    for name, had in keep_order:  # stability: slices stay where they are while they fit
        if name in placement or name not in usable or remaining <= 0:
            continue
        take = min(had, remaining)
        while take > 0 and not _fits(usable[name], request.slice, take):
            take -= 1
        if take:
            placement[name], remaining = take, remaining - take

    while remaining > 0:  # score: one slice at a time
        candidates = [c for c in usable.values() if _fits(c, request.slice, placement.get(c.name, 0) + 1)]
        if not candidates:
            for name, cluster in usable.items():
                diagnosis.setdefault(name, f"InsufficientCapacity: room for {_free_slices(cluster, request.slice)} "
                                           f"slice(s) of {request.slice.to_kubernetes()}")  # fmt: skip
            return PlacementResult(None, diagnosis, f"{request.count} slices do not fit in the pool; {remaining} left over")
        best = min(candidates, key=lambda c: _score(c, request, placement))
        placement[best.name] = placement.get(best.name, 0) + 1
        remaining -= 1
    for name in usable:
        if name not in placement:
            diagnosis.setdefault(name, "NotNeeded: the other clusters scored higher"
                                 if request.policy == "spread" else "NotNeeded: packed onto fewer clusters")
    return PlacementResult({k: v for k, v in sorted(placement.items()) if v}, diagnosis,
                           f"{request.count} slices placed ({request.policy})")  # fmt: skip


def _score(cluster: ClusterSnapshot, request: PlacementRequest, placement: dict[str, int]) -> tuple[object, ...]:
    """Lower is better. spread: the most free slices left; pack: a cluster already used, then the fewest
    free slices left (best fit)."""
    free_after = _free_slices(cluster, request.slice) - placement.get(cluster.name, 0) - 1
    if request.policy == "pack":
        return (0 if placement.get(cluster.name) else 1, free_after, cluster.name)
    return (-free_after, placement.get(cluster.name, 0), cluster.name)


def first_fit_whole_quota(quota: Resources, clusters: list[ClusterSnapshot]) -> str | None:
    """virtualcluster without slices: the whole quota on the first cluster that holds it (the baseline)."""
    for cluster in clusters:
        if cluster.ready and (cluster.placed + quota).fits_in(cluster.capacity):
            return cluster.name
    return None
