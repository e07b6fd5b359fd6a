"""pool_placement: how much of the tenants' quota the pool places, with no cluster at all (models/pool/
is pure). Generated workloads: super clusters of mixed sizes and shapes, and tenant namespaces whose
quotas come in several slice shapes, arriving one by one until they ask for 70, 90 or 100% of the pool
(by their dominant resource). Each namespace is placed on arrival and never moved:

- `spread` and `pack`: models/pool/placement.schedule, slices split across clusters;
- `slice_first_fit` (the baseline): virtualcluster's own namespace scheduler, each slice on the first
  cluster that holds it in a random order of the clusters (models/pool/placement.first_fit_slices);
- `first_fit`: virtualcluster without slices, the whole quota on the first cluster that holds it
  (models/pool/placement.first_fit_whole_quota);
- `optimal`: an upper bound, the best any placement could do knowing every namespace in advance: a
  mixed-integer program (HiGHS) choosing which namespaces to place and how many slices of each go
  where, under every cluster's cpu and memory.

The share placed weighs each namespace by its quota's cpu and memory, each relative to the pool's.
Placements per second time the placement call alone (snapshot building excluded), on the same inputs.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import highspy

from bench.common import emit, log
from models.pool.placement import (
    ClusterSnapshot,
    PlacementRequest,
    first_fit_slices,
    first_fit_whole_quota,
    schedule,
)
from models.pool.slicing import slice_count
from models.resources import Resources

GIB = 2**30
CLUSTER_CORES = (16, 24, 32, 48, 64)
GIB_PER_CORE = (2, 4, 8)
SLICE_SHAPES = ((1, 2), (2, 4), (2, 8), (4, 4))  # (cores, GiB)
MAX_SLICES = 12  # default of the max_slices parameter
MISSES = 20
DEFAULTS: dict[str, Any] = {
    "seeds": 20,
    "clusters": 6,
    "loads": "70,90,100",
    "solver_seconds": 60,
    "max_slices": MAX_SLICES,
}


@dataclass(frozen=True)
class Namespace:
    name: str
    quota: Resources
    slice: Resources
    count: int


@dataclass(frozen=True)
class Workload:
    clusters: dict[str, Resources]
    namespaces: list[Namespace]
    load: float  # what the namespaces ask, by dominant resource, relative to the pool

    def weight(self, quota: Resources) -> float:
        total = Resources.total(self.clusters.values())
        return sum(float(quota.get_or_zero(r) / total[r]) for r in ("cpu", "memory"))


def generate(*, seed: int, clusters: int, load: float, max_slices: int = MAX_SLICES) -> Workload:
    rng = random.Random(seed)
    pool = {}
    for i in range(clusters):
        cores = rng.choice(CLUSTER_CORES)
        pool[f"super-{i}"] = Resources(cpu=str(cores), memory=str(cores * rng.choice(GIB_PER_CORE) * GIB))
    total = Resources.total(pool.values())
    namespaces: list[Namespace] = []
    asked = Resources()
    misses = 0
    while misses < MISSES:  # the last few that would overshoot are skipped for smaller ones
        cores, gib = rng.choice(SLICE_SHAPES)
        slice_ = Resources(cpu=str(cores), memory=str(gib * GIB))
        # A quota that is not a whole number of slices: the last slice is partly unused, as in real pools.
        k = rng.randint(1, max_slices)
        short = Decimal(rng.choice(("0", "0.5"))) if k > 1 else Decimal(0)
        quota = Resources(cpu=str(Decimal(cores) * k - short), memory=str(gib * k * GIB))
        after = asked + quota
        if max(after["cpu"] / total["cpu"], after["memory"] / total["memory"]) > Decimal(load):
            misses += 1
            continue
        namespaces.append(Namespace(f"ns-{len(namespaces)}", quota, slice_, slice_count(quota, slice_)))
        asked = after
    actual = float(max(asked["cpu"] / total["cpu"], asked["memory"] / total["memory"]))
    return Workload(pool, namespaces, actual)


def _snapshots(workload: Workload, placed: dict[str, Resources]) -> list[ClusterSnapshot]:
    return [ClusterSnapshot(name=n, health="Ready", allocatable=cap, headroom=Resources(), placed=placed[n])
            for n, cap in workload.clusters.items()]  # fmt: skip


def run_policy(workload: Workload, policy: str, *, seed: int = 0) -> tuple[float, int, float]:
    """(share placed, placement calls, seconds spent in the calls) of one online policy; `seed` orders
    slice_first_fit's random choices."""
    placed = {name: Resources() for name in workload.clusters}
    weight, calls, seconds = 0.0, 0, 0.0
    rng = random.Random(seed)
    for ns in workload.namespaces:
        snapshots = _snapshots(workload, placed)
        started = time.perf_counter()
        if policy == "first_fit":
            target = first_fit_whole_quota(ns.quota, snapshots)
            seconds += time.perf_counter() - started
            where = None if target is None else {target: ns.quota}
        elif policy == "slice_first_fit":
            counts = first_fit_slices(ns.slice, ns.count, snapshots, rng)
            seconds += time.perf_counter() - started
            where = None if counts is None else {
                c: Resources({r: v * n for r, v in ns.slice.items()}) for c, n in counts.items()}  # fmt: skip
        else:
            result = schedule(PlacementRequest(ns.name, ns.slice, ns.count, policy=policy), snapshots)  # type: ignore[arg-type]
            seconds += time.perf_counter() - started
            where = None if result.placement is None else {
                c: Resources({r: v * n for r, v in ns.slice.items()}) for c, n in result.placement.items()}  # fmt: skip
        calls += 1
        if where is not None:
            for cluster, amount in where.items():
                placed[cluster] = placed[cluster] + amount
            weight += workload.weight(ns.quota)
    return weight / sum(workload.weight(ns.quota) for ns in workload.namespaces), calls, seconds


def optimal_bound(workload: Workload, *, time_limit: float) -> tuple[float, bool]:
    """(upper bound of the share placed, proven optimal). Slices may split across clusters, as in
    `schedule`; units are milli-cores and MiB so that the matrix stays small integers."""
    h = highspy.Highs()
    h.silent()
    h.setOptionValue("time_limit", float(time_limit))
    total = sum(workload.weight(ns.quota) for ns in workload.namespaces)
    chosen, slices = [], {}
    for ns in workload.namespaces:
        x = h.addBinary(obj=workload.weight(ns.quota) / total)
        chosen.append(x)
        ys = [h.addIntegral(lb=0, ub=ns.count) for _ in workload.clusters]
        slices[ns.name] = ys
        h.addConstr(sum(ys) == ns.count * x)
    units: dict[str, Callable[[Decimal], float]] = {
        "cpu": lambda v: float(v * 1000),
        "memory": lambda v: float(v / 2**20),
    }
    for i, cap in enumerate(workload.clusters.values()):
        for resource, unit in units.items():
            h.addConstr(sum(unit(ns.slice[resource]) * slices[ns.name][i] for ns in workload.namespaces)
                        <= unit(cap[resource]))  # fmt: skip
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    h.run()
    info = h.getInfo()
    proven = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return (float(info.objective_function_value) if proven else float(info.mip_dual_bound)), proven


def run(params: dict[str, Any]) -> None:
    loads = [int(x) for x in str(params["loads"]).split(",")]
    for load in loads:
        shares: dict[str, list[float]] = {p: [] for p in ("spread", "pack", "slice_first_fit", "first_fit", "optimal")}
        rates: dict[str, tuple[int, float]] = {p: (0, 0.0) for p in ("spread", "pack", "slice_first_fit", "first_fit")}
        sizes, actual_loads, all_proven = [], [], True
        for seed in range(int(params["seeds"])):
            workload = generate(
                seed=seed, clusters=int(params["clusters"]), load=load / 100, max_slices=int(params["max_slices"])
            )
            sizes.append(len(workload.namespaces))
            actual_loads.append(workload.load)
            for policy in rates:
                share, calls, seconds = run_policy(workload, policy, seed=seed)
                shares[policy].append(share)
                rates[policy] = (rates[policy][0] + calls, rates[policy][1] + seconds)
            bound, proven = optimal_bound(workload, time_limit=float(params["solver_seconds"]))
            shares["optimal"].append(bound)
            all_proven &= proven
            log(f"load {load}% seed {seed}: " + ", ".join(f"{p} {v[-1]:.3f}" for p, v in shares.items()))
        mean = {p: 100 * sum(v) / len(v) for p, v in shares.items()}
        common = {"load_percent": load, "actual_load_percent": round(100 * sum(actual_loads) / len(actual_loads), 1),
                  "seeds": int(params["seeds"]), "clusters": int(params["clusters"]), "max_slices": int(params["max_slices"]),
                  "namespaces_mean": round(sum(sizes) / len(sizes), 1), "optimal_percent": round(mean["optimal"], 2),
                  "optimal_proven": all_proven}  # fmt: skip
        for policy in ("spread", "pack", "first_fit", "optimal"):
            emit(f"pool_placement.{policy}.share.load{load}", mean[policy], "% of quota placed",
                 baseline=mean["slice_first_fit"], params={
                     **common, "baseline": "virtualcluster's scheduler: per-slice first fit, random cluster order",
                     "points_over_baseline": round(mean[policy] - mean["slice_first_fit"], 2),
                     "points_over_whole_quota_first_fit": round(mean[policy] - mean["first_fit"], 2),
                     "points_below_optimal": round(mean["optimal"] - mean[policy], 2)})  # fmt: skip
        base_calls, base_seconds = rates["slice_first_fit"]
        for policy in ("spread", "pack"):
            calls, seconds = rates[policy]
            emit(f"pool_placement.{policy}.placements_per_second.load{load}", calls / seconds, "placements/s",
                 baseline=base_calls / base_seconds, params={**common, "baseline": "per-slice first fit"})  # fmt: skip
