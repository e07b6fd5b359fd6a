"""Fairness between the pool's tenants (models/pool/fairness.py): the order a pass tries the namespaces that
still need slices (weighted dominant-resource max-min, no preemption), and the shares explain reports."""

from __future__ import annotations

import random
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.pool.fairness import Ask, TenantShare, fair_order, pool_capacity, shares
from models.pool.health import HealthState
from models.pool.placement import ClusterSnapshot
from models.resources import Resources

pytestmark = pytest.mark.pool
START = datetime(2026, 1, 1, tzinfo=UTC)
POOL = Resources(cpu="100", memory="100Gi")


def ask(tenant: str, namespace: str, *, minute: int = 0, cpu: str = "1", memory: str = "1Gi") -> Ask:
    return Ask(tenant=tenant, namespace=namespace, created=START + timedelta(minutes=minute),
               demand=Resources(cpu=cpu, memory=memory))  # fmt: skip


def many(tenant: str, count: int, *, minute: int = 0, cpu: str = "1", memory: str = "1Gi") -> list[Ask]:
    """`count` equal asks of one tenant, one a second apart from `minute` on."""
    return [Ask(tenant=tenant, namespace=f"{tenant}-{i}", created=START + timedelta(minutes=minute, seconds=i),
                demand=Resources(cpu=cpu, memory=memory)) for i in range(count)]  # fmt: skip


def names(order: list[Ask]) -> list[str]:
    return [f"{a.tenant}/{a.namespace}" for a in order]


def placed_until_full(order: list[Ask], capacity: Resources) -> Counter[str]:
    """Asks placed per tenant by a pass that tries them in `order` against the pool as one bin."""
    free, placed = capacity, Counter[str]()
    for item in order:
        if item.demand.fits_in(free):
            free, placed[item.tenant] = free - item.demand, placed[item.tenant] + 1
    return placed


def dominant(demand: Resources, capacity: Resources) -> Fraction:
    return max(Fraction(demand.get_or_zero(r)) / Fraction(capacity[r]) for r in ("cpu", "memory"))


# Asks of a few tenants, with unique (tenant, namespace), ages that collide, and shapes that differ.
tenants = st.sampled_from(["a", "b", "c", "d", "e"])
asks_strategy = st.lists(st.builds(lambda t, n, m, c, g: ask(t, f"ns{n}", minute=m, cpu=f"{c}", memory=f"{g}Gi"),
                                   tenants, st.integers(0, 30), st.integers(0, 5), st.integers(0, 8), st.integers(0, 8)),
                         max_size=60, unique_by=lambda a: (a.tenant, a.namespace))  # fmt: skip
held_strategy = st.dictionaries(tenants, st.builds(lambda c, g: Resources(cpu=f"{c}", memory=f"{g}Gi"),
                                                   st.integers(0, 60), st.integers(0, 60)))  # fmt: skip
weights_strategy = st.dictionaries(tenants, st.integers(1, 1000))
capacity_strategy = st.builds(lambda c, g: Resources(cpu=f"{c}", memory=f"{g}Gi"), st.integers(0, 200),
                              st.integers(0, 200))  # fmt: skip


@given(asks_strategy, held_strategy, weights_strategy, capacity_strategy, st.randoms(use_true_random=False))
def test_the_order_is_a_permutation_of_the_asks_and_does_not_depend_on_the_order_they_came_in(
    asks: list[Ask], held: dict[str, Resources], weights: dict[str, int], capacity: Resources, rng: random.Random
) -> None:
    order = fair_order(asks, held=held, weights=weights, capacity=capacity)
    assert Counter(order) == Counter(asks)
    shuffled = list(asks)
    rng.shuffle(shuffled)
    assert fair_order(shuffled, held=held, weights=weights, capacity=capacity) == order


@given(asks_strategy, held_strategy, weights_strategy, capacity_strategy)
def test_each_tenant_s_asks_keep_their_age_order(asks: list[Ask], held: dict[str, Resources],
                                                 weights: dict[str, int], capacity: Resources) -> None:  # fmt: skip
    order = fair_order(asks, held=held, weights=weights, capacity=capacity)
    for tenant in {a.tenant for a in asks}:
        own = [(a.created, a.namespace) for a in order if a.tenant == tenant]
        assert own == sorted(own)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 8), st.integers(1, 8)), min_size=2, max_size=5),
       st.integers(0, 2**32 - 1))  # fmt: skip
def test_while_every_tenant_asks_weighted_shares_stay_within_one_ask_of_each_other(
    tenants_: list[tuple[int, int, int]], seed: int
) -> None:
    """Each tenant (weight, then the upper bounds of its asks' cpu and memory) asks more than the pool: in
    every prefix of the order until one runs out, the weighted shares are no further apart than the largest
    weighted ask (with equal weights: within one ask)."""
    rng = random.Random(seed)
    weights = {f"t{i}": weight for i, (weight, _, _) in enumerate(tenants_)}
    asks = [ask(f"t{i}", f"ns{n}", minute=rng.randrange(100), cpu=f"{rng.randint(0, cpu)}", memory=f"{rng.randint(1, gib)}Gi")
            for i, (_, cpu, gib) in enumerate(tenants_) for n in range(120)]  # fmt: skip
    step = max(dominant(a.demand, POOL) / weights[a.tenant] for a in asks)
    held = dict.fromkeys(weights, Resources())
    left = Counter(a.tenant for a in asks)
    for item in fair_order(asks, held=held, weights=weights, capacity=POOL):
        held[item.tenant] = held[item.tenant] + item.demand
        left[item.tenant] -= 1
        weighted = [s.weighted for s in shares(held, weights=weights, capacity=POOL).values()]
        assert max(weighted) - min(weighted) <= step
        if not left[item.tenant]:
            break


@pytest.mark.parametrize(
    ("weight_a", "weight_b", "placed_a", "placed_b"),
    [
        pytest.param(1, 1, 50, 50, id="equal weights share equally"),
        pytest.param(2, 1, 67, 33, id="weights 2:1 place 2:1"),
        pytest.param(3, 1, 75, 25, id="weights 3:1 place 3:1"),
        pytest.param(1, 4, 20, 80, id="the younger tenant with the larger weight gets more"),
    ],
)
def test_placed_slices_follow_the_weights_when_the_pool_is_short(weight_a: int, weight_b: int, placed_a: int,
                                                                  placed_b: int) -> None:  # fmt: skip
    asks = many("a", 150) + many("b", 150, minute=60)
    order = fair_order(asks, held={}, weights={"a": weight_a, "b": weight_b}, capacity=POOL)
    assert placed_until_full(order, POOL) == {"a": placed_a, "b": placed_b}


def test_a_tenant_that_asks_little_gets_all_it_asks_before_a_larger_one_fills_the_pool() -> None:
    asks = many("big", 200) + many("small", 3, minute=60)
    order = fair_order(asks, held={}, weights={}, capacity=Resources(cpu="20", memory="20Gi"))
    assert names(order)[:6] == ["big/big-0", "small/small-0", "big/big-1", "small/small-1", "big/big-2",
                                "small/small-2"]  # fmt: skip
    assert placed_until_full(order, Resources(cpu="20", memory="20Gi")) == {"big": 17, "small": 3}


def test_a_tenant_arriving_late_with_nothing_held_goes_first_though_its_namespace_is_newest() -> None:
    asks = many("early", 5) + [ask("late", "web", minute=24 * 60)]
    order = fair_order(asks, held={"early": Resources(cpu="40", memory="10Gi")}, weights={}, capacity=POOL)
    assert names(order) == ["late/web", "early/early-0", "early/early-1", "early/early-2", "early/early-3",
                            "early/early-4"]  # fmt: skip


def test_a_tenant_beyond_its_share_waits_until_the_others_catch_up() -> None:
    asks = many("early", 3) + many("late", 12, minute=60, cpu="5", memory="1Gi")
    order = fair_order(asks, held={"early": Resources(cpu="50", memory="1Gi")}, weights={}, capacity=POOL)
    # early holds 50% of the cpu: late goes until it holds as much (10 asks of 5%); then the smaller share
    # goes next, the older ask on a tie.
    assert [a.tenant for a in order] == ["late"] * 10 + ["early", "late", "early", "early", "late"]


def test_tenants_are_compared_by_the_resource_each_uses_most() -> None:
    """DRF: cpu-heavy and memory-heavy namespaces of the same dominant share alternate; by cpu alone, the
    memory-heavy tenant would go ten times for each cpu-heavy ask."""
    asks = many("cpu-heavy", 5, cpu="10", memory="1Gi") + many("memory-heavy", 5, minute=60, cpu="1", memory="10Gi")
    order = fair_order(asks, held={}, weights={}, capacity=POOL)
    assert [a.tenant for a in order] == ["cpu-heavy", "memory-heavy"] * 5


@pytest.mark.parametrize(
    ("asks", "expected"),
    [
        pytest.param([ask("b", "x", minute=1), ask("a", "y", minute=2)], ["b/x", "a/y"],
                     id="equal shares: the older ask first"),
        pytest.param([ask("b", "x"), ask("a", "y")], ["a/y", "b/x"],
                     id="equal shares and ages: the tenant's name"),
        pytest.param([ask("a", "y"), ask("a", "x")], ["a/x", "a/y"],
                     id="one tenant, equal ages: the namespace's name"),
        pytest.param([ask("a", "web"), ask("b", "web")], ["a/web", "b/web"],
                     id="two tenants with the same namespace name are two asks"),
    ],
)  # fmt: skip
def test_ties_are_broken_by_age_then_tenant_then_namespace(asks: list[Ask], expected: list[str]) -> None:
    assert names(fair_order(asks, held={}, weights={}, capacity=POOL)) == expected


@pytest.mark.parametrize(
    "capacity",
    [
        pytest.param(Resources(), id="no capacity at all"),
        pytest.param(Resources(cpu="0", memory="0"), id="no healthy cluster: zero cpu and memory"),
    ],
)
def test_a_pool_without_capacity_orders_by_creation(capacity: Resources) -> None:
    asks = [ask("b", "x", minute=2), ask("a", "z", minute=1), ask("a", "y", minute=1)]
    order = fair_order(asks, held={"a": Resources(cpu="9")}, weights={"b": 5}, capacity=capacity)
    assert names(order) == ["a/y", "a/z", "b/x"]


def test_a_resource_the_pool_has_none_of_measures_no_share() -> None:
    capacity = Resources(cpu="0", memory="10Gi")
    asks = [ask("a", "x", cpu="50", memory="1Gi"), ask("b", "y", minute=1, cpu="1", memory="2Gi")]
    assert names(fair_order(asks, held={"a": Resources(cpu="99")}, weights={}, capacity=capacity)) == ["a/x", "b/y"]
    assert shares({"a": Resources(cpu="99", memory="1Gi")}, weights={}, capacity=capacity)["a"].resource == "memory"


def test_a_weight_below_one_is_a_caller_s_bug() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        fair_order([ask("a", "x")], held={}, weights={"a": 0}, capacity=POOL)


def test_shares_say_each_tenant_s_dominant_resource_and_weight() -> None:
    held = {"a": Resources(cpu="30", memory="10Gi"), "b": Resources(cpu="5", memory="50Gi")}
    result = shares(held, weights={"a": 2, "idle": 3}, capacity=POOL)
    assert result == {
        "a": TenantShare(dominant=Fraction(3, 10), resource="cpu", weight=2),
        "b": TenantShare(dominant=Fraction(1, 2), resource="memory", weight=1),
        "idle": TenantShare(dominant=Fraction(0), resource=None, weight=3),
    }
    assert result["a"].weighted == Fraction(3, 20)
    assert shares(held, weights={}, capacity=Resources())["a"] == TenantShare(Fraction(0), None, 1)


def test_the_pool_s_capacity_counts_the_clusters_that_take_new_slices() -> None:
    def cluster(name: str, health: HealthState) -> ClusterSnapshot:
        return ClusterSnapshot(name, health, Resources(cpu="10", memory="10Gi"), Resources(cpu="2", memory="1Gi"),
                               Resources(cpu="5"))  # fmt: skip

    clusters = [cluster("a", "Ready"), cluster("b", "Ready"), cluster("c", "Suspect"), cluster("d", "Unreachable"),
                cluster("e", "Unknown")]  # fmt: skip
    assert pool_capacity(clusters) == Resources(cpu="16", memory="18Gi")


def test_ten_thousand_namespaces_of_a_hundred_tenants_are_ordered_in_well_under_a_second() -> None:
    rng = random.Random(36)
    asks = [Ask(tenant=f"t{rng.randrange(100)}", namespace=f"ns{i}", created=START + timedelta(seconds=rng.randrange(10**6)),
                demand=Resources(cpu=f"{rng.randint(1, 8)}", memory=f"{rng.randint(1, 16)}Gi")) for i in range(10_000)]  # fmt: skip
    held = {f"t{i}": Resources(cpu=f"{rng.randint(0, 50)}", memory=f"{rng.randint(0, 200)}Gi") for i in range(100)}
    weights = {f"t{i}": rng.randint(1, 1000) for i in range(100)}
    started = time.perf_counter()
    order = fair_order(asks, held=held, weights=weights, capacity=Resources(cpu="5000", memory="20000Gi"))
    assert time.perf_counter() - started < 1.0
    assert len(order) == len(asks)
