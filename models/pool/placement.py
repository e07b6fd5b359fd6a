"""Namespace placement: where a namespace's quota slices go, as named steps over an immutable snapshot of
the super clusters (Karmada's shape), keeping a closed reason code and a message for every cluster it did
not use. models/pool/namespaces.py calls `schedule`; bench/pool_placement.py measures it.

The steps, in the order of the code:
1. fit: every filter plugin judges each cluster; the first rejection is its reason. Only a Ready cluster
   (models/pool/health.py) takes new slices: a Suspect one (failing within the grace period) and one not
   probed yet keep what they hold (a blip moves nothing), an Unreachable one keeps nothing. A cluster the
   request names that is not in the snapshot is Unknown (removed from the pool).
2. mandatory: a user-edited placement is kept (capped to the slice count); an entry on a Ready cluster
   that does not fit fails the whole placement (InsufficientCapacity); one on a Suspect or unprobed cluster
   is kept as written (its capacity cannot be checked, and waiting out a blip moves nothing). An entry on
   an Unreachable cluster is models/pool/namespaces.py's: the namespace waits for it.
3. keep: the previous placement stays where it still fits, and on the Suspect and unprobed clusters
   (stability).
4. score and select, one slice at a time: among the feasible clusters that hold one more slice, the
   policy's score plugins rank them and the best takes it.
   `spread` balances the free share of the clusters; `pack` keeps empty clusters empty (the clusters
   the namespace or others use first), and among those leaves cpu and memory free in the most even
   shares (what a later slice of any shape can still use), then fills the fullest (fewest clusters). No room left fails the whole placement: nothing partial is ever returned.
5. every feasible cluster left without slices is NotNeeded.

Deterministic, and better than virtualcluster's first fit over a Go map. The policy's score plugins are
weighted by rank, not summed: a later plugin only breaks the ties of the ones before it (then the name),
because a weighted sum would let a tie-breaker outvote the main criterion on some snapshot. Ranked so,
Karmada's normalisation of each plugin to 0–100 over the candidates would change no decision (it keeps
each plugin's order), so raw scores are compared: exact, and a placement costs no normalising.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property
from typing import Literal

from models.pool.health import HealthState, accepts_slices, drains
from models.resources import Resources

Policy = Literal["spread", "pack"]
# Why a cluster got no (more) slices: one per cluster in the diagnosis. Suspect, NotProbed and Unreachable
# are its health (models/pool/health.py); Unknown is a name the pool does not have.
RejectionCode = Literal["Suspect", "NotProbed", "Unreachable", "Unknown", "InsufficientCapacity", "NotNeeded"]


@dataclass(frozen=True)
class ClusterSnapshot:
    name: str
    health: HealthState  # as the prober last recorded it on the SuperCluster's status
    allocatable: Resources  # of its Ready nodes, at the last successful probe
    headroom: Resources  # kept free: the SuperCluster's spec.headroom and the pool's percent (`headroom`)
    placed: Resources  # what other namespaces' slices hold there

    @cached_property  # read at every slice of a placement; the snapshot never changes
    def capacity(self) -> Resources:
        return (self.allocatable - self.headroom).clamp_at_zero()

    @property
    def accepts_slices(self) -> bool:
        return accepts_slices(self.health)

    @property
    def drains(self) -> bool:
        return drains(self.health)


def headroom(*, allocatable: Resources, reserved: Resources, percent: int) -> Resources:
    """What a cluster keeps free: the SuperCluster's spec.headroom plus the pool's headroomPercent of its
    allocatable (ClusterConfig spec.pool), so that the others can take a failed cluster's slices."""
    return reserved + allocatable.scale(percent)


@dataclass(frozen=True)
class PlacementRequest:
    namespace: str
    slice: Resources
    count: int
    policy: Policy = "spread"
    mandatory: dict[str, int] = field(default_factory=dict)  # entries a user wrote: kept
    previous: dict[str, int] = field(default_factory=dict)  # the last placement: kept where it still fits


@dataclass(frozen=True)
class Rejection:
    code: RejectionCode
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass(frozen=True)
class Fits:
    """A filter plugin's verdict for a cluster that may take slices."""


FilterResult = Fits | Rejection
FilterPlugin = Callable[[PlacementRequest, ClusterSnapshot], FilterResult]


@dataclass(frozen=True)
class Candidate:
    """A feasible cluster as a score plugin sees it: how many slices of this request it already holds,
    how many free slices it would have left after taking one more, and (computed when a plugin reads it)
    what share of its capacity of each of the slice's resources would be left free then."""

    cluster: ClusterSnapshot
    held: int
    free_after: int
    slice: Resources

    @cached_property
    def free_shares_after(self) -> tuple[Decimal, ...]:
        """Decimal quotients (28 digits, the same on every machine): a Fraction per candidate and slice
        made pack three times slower."""
        capacity, placed, taken = self.cluster.capacity, self.cluster.placed, self.held + 1
        return tuple((capacity[name] - placed.get_or_zero(name) - size * taken) / capacity[name]
                     for name, size in sorted(self.slice.items()) if size > 0 and capacity.get_or_zero(name) > 0)  # fmt: skip


# A score, higher is better; `select` compares the plugins' scores in rank order.
ScorePlugin = Callable[[Candidate], int | Decimal]


@dataclass(frozen=True)
class PlacementResult:
    placement: dict[str, int] | None  # None: not placed, and nothing written
    rejections: dict[str, Rejection]  # cluster -> why it got no (more) slices
    message: str

    @property
    def diagnosis(self) -> dict[str, str]:
        """The rejections as the namespace's placement status and the Web UI print them: "Code: message"."""
        return {name: str(rejection) for name, rejection in self.rejections.items()}


# Filter plugins -------------------------------------------------------------------------------------


HEALTH_REJECTIONS: dict[HealthState, Rejection] = {
    "Suspect": Rejection("Suspect", "probes failing within the grace period: keeps the slices it holds, takes no new ones"),
    "Unknown": Rejection("NotProbed", "not probed yet: keeps the slices it holds, takes no new ones"),
    "Unreachable": Rejection("Unreachable", "probes failing past the grace period: its slices move elsewhere"),
}


def cluster_healthy(request: PlacementRequest, cluster: ClusterSnapshot) -> FilterResult:
    return HEALTH_REJECTIONS.get(cluster.health) or Fits()


FILTERS: tuple[FilterPlugin, ...] = (cluster_healthy,)


# Score plugins --------------------------------------------------------------------------------------


def most_room_left(candidate: Candidate) -> int:
    return candidate.free_after


def fewest_slices_held(candidate: Candidate) -> int:
    return -candidate.held


def already_used(candidate: Candidate) -> int:
    return 1 if candidate.held else 0


def least_room_left(candidate: Candidate) -> int:
    """Best fit: the cluster that the slice fills the most."""
    return -candidate.free_after


def in_use(candidate: Candidate) -> int:
    """A cluster that this or another namespace already uses before an empty one, which stays empty."""
    return 1 if candidate.held or any(amount > 0 for amount in candidate.cluster.placed.values()) else 0


def evenly_free(candidate: Candidate) -> Decimal:
    """Leaves the slice's resources free in the most even shares of the cluster's capacity: filling a
    cluster by one resource (best fit by slice count) strands the other, which no later slice can use."""
    shares = candidate.free_shares_after
    return -(max(shares) - min(shares)) if shares else Decimal(0)


# Per policy, in rank order: a plugin breaks the ties of the ones before it.
SCORES: dict[Policy, tuple[ScorePlugin, ...]] = {
    "spread": (most_room_left, fewest_slices_held),
    "pack": (already_used, in_use, evenly_free, least_room_left),
}


# The steps ------------------------------------------------------------------------------------------


def free_slices(cluster: ClusterSnapshot, slice_: Resources) -> int:
    free = (cluster.capacity - cluster.placed).clamp_at_zero()
    return int(min((free.get_or_zero(name) // size for name, size in slice_.items() if size > 0), default=0))


def room(cluster: ClusterSnapshot, slice_: Resources) -> int:
    """How many slices the cluster holds beside what other namespaces hold there: none while they hold
    more than its capacity of anything. Computed once per request; every step then compares counts."""
    return free_slices(cluster, slice_) if cluster.placed.fits_in(cluster.capacity) else 0


def fit(request: PlacementRequest, clusters: list[ClusterSnapshot]) -> tuple[dict[str, ClusterSnapshot], dict[str, Rejection]]:
    """The feasible clusters by name (sorted), and the rejection of every other cluster."""
    feasible: dict[str, ClusterSnapshot] = {}
    rejections: dict[str, Rejection] = {}
    for cluster in sorted(clusters, key=lambda c: c.name):
        verdicts = (plugin(request, cluster) for plugin in FILTERS)
        rejection = next((v for v in verdicts if isinstance(v, Rejection)), None)
        if rejection is None:
            feasible[cluster.name] = cluster
        else:
            rejections[cluster.name] = rejection
    known = {c.name for c in clusters}
    for name in sorted({*request.mandatory, *request.previous} - known):
        rejections[name] = Rejection("Unknown", "no such super cluster (removed from the pool); its slices move elsewhere")
    return feasible, rejections


def select(candidates: list[Candidate], plugins: tuple[ScorePlugin, ...]) -> ClusterSnapshot:
    """The best candidate by the plugins' scores in rank order, ties to the first name."""
    best = min(candidates, key=lambda c: (*(-plugin(c) for plugin in plugins), c.cluster.name))
    return best.cluster


def _candidates(feasible: Mapping[str, ClusterSnapshot], placement: Mapping[str, int], rooms: Mapping[str, int],
                slice_: Resources) -> list[Candidate]:  # fmt: skip
    """The feasible clusters that hold one more slice."""
    held = {name: placement.get(name, 0) for name in feasible}
    return [Candidate(c, held[c.name], rooms[c.name] - held[c.name] - 1, slice_)
            for c in feasible.values() if held[c.name] < rooms[c.name]]  # fmt: skip


def schedule(request: PlacementRequest, clusters: list[ClusterSnapshot]) -> PlacementResult:
    feasible, rejections = fit(request, clusters)
    rooms = {name: room(cluster, request.slice) for name, cluster in feasible.items()}
    # Suspect and unprobed clusters: what they hold stays, unchecked (their capacity may not be known).
    holding = {c.name for c in clusters if c.name not in feasible and not c.drains}

    placement: dict[str, int] = {}
    remaining = request.count
    for name, wanted in sorted(request.mandatory.items()):  # the user's entries, capped to the total
        take = min(wanted, remaining)
        if take <= 0 or (name not in feasible and name not in holding):
            continue
        if name in feasible and take > rooms[name]:
            refused = Rejection("InsufficientCapacity", f"cannot hold the slices the placement annotation asks for ({take})")
            return PlacementResult(None, {**rejections, name: refused},
                                   f"the edited placement asks {name} for {take} slices, which do not fit")  # fmt: skip
        placement[name], remaining = take, remaining - take

    def keep_first(item: tuple[str, int]) -> tuple[int, str]:
        """When the quota shrank, which slices stay: pack keeps the biggest holdings, spread the roomiest."""
        name, had = item
        if request.policy == "pack":
            return (-had, name)
        return (-rooms[name] if name in feasible else 0, name)

    for name, had in sorted(request.previous.items(), key=keep_first):  # slices stay where they are while they fit
        if name in placement or (name not in feasible and name not in holding) or remaining <= 0:
            continue
        take = min(had, remaining)
        if name in feasible:
            take = min(take, rooms[name])
        if take:
            placement[name], remaining = take, remaining - take

    while remaining > 0:  # score and select, one slice at a time
        candidates = _candidates(feasible, placement, rooms, request.slice)
        if not candidates:
            for name in feasible:
                rejections.setdefault(name, Rejection("InsufficientCapacity", f"room for {rooms[name]} "
                                                      f"slice(s) of {request.slice.to_kubernetes()}"))  # fmt: skip
            return PlacementResult(None, rejections, f"{request.count} slices do not fit in the pool; {remaining} left over")
        best = select(candidates, SCORES[request.policy])
        placement[best.name] = placement.get(best.name, 0) + 1
        remaining -= 1
    not_needed = "the other clusters scored higher" if request.policy == "spread" else "packed onto fewer clusters"
    for name in feasible:
        if name not in placement:
            rejections.setdefault(name, Rejection("NotNeeded", not_needed))
    return PlacementResult({k: v for k, v in sorted(placement.items()) if v}, rejections,
                           f"{request.count} slices placed ({request.policy})")  # fmt: skip


def first_fit_slices(slice_: Resources, count: int, clusters: list[ClusterSnapshot], rng: random.Random) -> dict[str, int] | None:
    """virtualcluster's namespace scheduler (a baseline): each slice on the first cluster that holds it,
    the clusters in a random order for every slice; the namespace is placed only if every slice is."""
    placed = {c.name: c.placed for c in clusters if c.accepts_slices}
    capacity = {c.name: c.capacity for c in clusters}
    placement: dict[str, int] = {}
    for _ in range(count):
        order = sorted(placed)
        rng.shuffle(order)
        target = next((name for name in order if (placed[name] + slice_).fits_in(capacity[name])), None)
        if target is None:
            return None
        placed[target] = placed[target] + slice_
        placement[target] = placement.get(target, 0) + 1
    return placement


def first_fit_whole_quota(quota: Resources, clusters: list[ClusterSnapshot]) -> str | None:
    """virtualcluster without slices: the whole quota on the first cluster that holds it (the baseline)."""
    for cluster in clusters:
        if cluster.accepts_slices and (cluster.placed + quota).fits_in(cluster.capacity):
            return cluster.name
    return None
