"""Fairness between the tenants that share the pool: the order in which a pass (activities/pool.py
`schedule_pool`) tries the namespaces that still need slices, and each tenant's share for `tidepool explain`
and status. Pure; the pass fetches what it holds and asks, then places in this order
(models/pool/namespaces.py decides each namespace).

The rule, in the order of the code:
1. A tenant's share is its dominant share (DRF, the multi-resource form of max-min): the largest fraction
   of the pool's capacity it holds in cpu or memory (the resources quotas are sliced in), divided by its
   weight (Tenant spec.weight, 1 when absent). A resource the pool has none of is left out: nobody can be
   placed in it, so it measures nothing.
2. Repeatedly, the tenant with the smallest share that still asks goes next, with its oldest ask; that
   ask's demand is added to its share as if placed. The pass may still fail to fit it, and later asks are
   tried all the same (work-conserving: capacity one tenant cannot use goes to the next).
3. Ties: the older ask, then the tenant's name, then the namespace's name: the order must be the same
   whenever the pass's input is (`tidepool simulate pool` replays what a pass recorded).
4. A pool with no capacity (no healthy cluster) orders by creation alone: no share can be measured, and
   nothing will be placed anyway.

Why this rule: nothing placed is ever preempted (its pods run), so fairness can only decide who gets the
capacity that frees up, or that many ask for at once. Ordering by share rather than by arrival is what keeps
a tenant that arrives late from being starved by one that came first with many namespaces, and a tenant that
asks little gets all it asks before a larger one grows beyond it (max-min). Dominant shares make a tenant
of memory-heavy namespaces and one of cpu-heavy ones comparable; weights let the pool's owner give a tenant
more. A heap over tenants keeps a pass of n namespaces O(n log n).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction

from models.pool.placement import ClusterSnapshot
from models.pool.slicing import SLICED
from models.resources import Resources

DEFAULT_WEIGHT = 1  # Tenant spec.weight's default: a tenant whose weight the pass does not know


@dataclass(frozen=True)
class Ask:
    """A namespace that still needs slices: `demand` is its slice × the slices still to place."""

    tenant: str
    namespace: str
    created: datetime  # the namespace's creationTimestamp
    demand: Resources


@dataclass(frozen=True)
class TenantShare:
    """What `tidepool explain` and status say of a tenant: the fraction of the pool it holds in its
    dominant `resource` (None when it holds nothing the pool can measure), its weight, and the two
    divided, which the pass orders by."""

    dominant: Fraction
    resource: str | None
    weight: int

    @property
    def weighted(self) -> Fraction:
        return self.dominant / self.weight


def pool_capacity(clusters: Iterable[ClusterSnapshot]) -> Resources:
    """What the pool can place: allocatable minus headroom of the clusters that take new slices."""
    return Resources.total(c.capacity for c in clusters if c.accepts_slices)


def shares(held: Mapping[str, Resources], *, weights: Mapping[str, int],
           capacity: Resources) -> dict[str, TenantShare]:  # fmt: skip
    """Every tenant's share, from what its namespaces hold: those of `held` and those of `weights` (a
    registered tenant that holds nothing has a share of 0)."""
    measured = _measured(capacity)
    result: dict[str, TenantShare] = {}
    for tenant in sorted(set(held) | set(weights)):
        usage = _fractions(held.get(tenant, Resources()), measured)
        dominant = max(usage, default=Fraction(0))
        resource = measured[usage.index(dominant)][0] if dominant else None
        result[tenant] = TenantShare(dominant=dominant, resource=resource, weight=_weight(weights, tenant))
    return result


def fair_order(asks: Sequence[Ask], *, held: Mapping[str, Resources], weights: Mapping[str, int],
               capacity: Resources) -> list[Ask]:  # fmt: skip
    """`asks` in the order a pass should try them (the rule in the module docstring). `held`: what each
    tenant's namespaces hold already (placed slices); `capacity`: `pool_capacity` of the pass's snapshot."""
    by_age = sorted(asks, key=lambda ask: (ask.created, ask.tenant, ask.namespace))
    measured = _measured(capacity)
    if not measured:
        return by_age
    queues: dict[str, list[Ask]] = {}  # tenant -> its asks, newest first (popped from the end)
    for ask in reversed(by_age):
        queues.setdefault(ask.tenant, []).append(ask)
    usage = {tenant: _fractions(held.get(tenant, Resources()), measured) for tenant in queues}
    heap = [_entry(tenant, queue[-1], usage[tenant], _weight(weights, tenant)) for tenant, queue in queues.items()]
    heapq.heapify(heap)
    order: list[Ask] = []
    while heap:
        tenant = heapq.heappop(heap)[2]
        ask = queues[tenant].pop()
        order.append(ask)
        usage[tenant] = [u + d for u, d in zip(usage[tenant], _fractions(ask.demand, measured), strict=True)]
        if queues[tenant]:
            heapq.heappush(heap, _entry(tenant, queues[tenant][-1], usage[tenant], _weight(weights, tenant)))
    return order


# A tenant in the heap: (weighted share, its oldest ask's age, the tenant), the smallest first. Each tenant is in
# it once, with its oldest ask (its queue is in the tie order): the tenant's name breaks every tie left.
_Entry = tuple[Fraction, datetime, str]


def _entry(tenant: str, oldest: Ask, usage: list[Fraction], weight: int) -> _Entry:
    return max(usage) / weight, oldest.created, tenant


def _measured(capacity: Resources) -> list[tuple[str, Fraction]]:
    """The resources shares are measured in, with the pool's capacity of each: those it has some of."""
    return [(name, Fraction(capacity[name])) for name in SLICED if capacity.get_or_zero(name) > 0]


def _fractions(amounts: Resources, measured: list[tuple[str, Fraction]]) -> list[Fraction]:
    """`amounts` as fractions of the pool's capacity, one per measured resource (exact: no float may reorder
    two tenants between a pass and its replay)."""
    return [Fraction(amounts.get_or_zero(name)) / total for name, total in measured]


def _weight(weights: Mapping[str, int], tenant: str) -> int:
    weight = weights.get(tenant, DEFAULT_WEIGHT)
    if weight < 1:  # the Tenant CRD admits 1..1000: a smaller one is a caller's bug, not a tenant's choice
        raise ValueError(f"tenant {tenant}'s weight must be at least 1, got {weight}")
    return weight
