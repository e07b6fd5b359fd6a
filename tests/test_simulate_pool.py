"""`tidepool simulate pool` (issue 20, part 2) against the scheduler's own decisions.

A pool pass here is the activity's (activities/pool.py `schedule_pool`) without Kubernetes: namespaces are
annotation maps, each decided by the real `decide_namespace`, a Place written back as the activity writes
it, and every pass recorded through the real `live_entry`. The property: a history recorded under one
policy, replayed under another, places every namespace where the scheduler itself places it under that
other policy (and replayed under its own, changes nothing)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from models.explain import Fact
from models.names import (
    MANDATORY_ANNOTATION,
    PLACED_SLICE_ANNOTATION,
    PLACEMENT_STATUS_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    POLICY_ANNOTATION,
    SCHEDULED_ANNOTATION,
    SLICE_ANNOTATION,
)
from models.pool.namespaces import (
    Keep,
    Place,
    Refuse,
    decide_namespace,
    held_slice,
    live_entry,
    mandatory_annotation,
    placement_of,
    placement_status,
)
from models.pool.placement import ClusterSnapshot, Policy
from models.pool.result import PoolClusterRecord, PoolPassResult
from models.resources import Resources
from models.simulate import simulate_pool

pytestmark = pytest.mark.explain
T0 = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)
SLICE = {"cpu": "2", "memory": "4Gi"}
CLUSTERS = [ClusterSnapshot(name, "Ready", Resources({"cpu": cpu, "memory": f"{2 * int(cpu)}Gi"}), Resources(), Resources())
            for name, cpu in (("s1", "8"), ("s2", "12"), ("s3", "6"))]  # fmt: skip


class Pool:
    """Tenant namespaces as annotations and quotas, passed over as the activity does."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.annotations: dict[str, dict[str, str]] = {}
        self.quotas: dict[str, dict[str, str]] = {}
        self.facts: list[Fact] = []

    def add(self, name: str, slices: int, *, own_policy: str | None = None, chosen: dict[str, int] | None = None) -> None:
        self.annotations[name] = {SLICE_ANNOTATION: json.dumps(SLICE)}
        if own_policy:
            self.annotations[name][POLICY_ANNOTATION] = own_policy
        if chosen:  # a user's placement, written before the scheduler's first pass over it
            self.annotations[name][PLACEMENTS_ANNOTATION] = json.dumps(chosen)
        self.resize(name, slices)

    def resize(self, name: str, slices: int) -> None:
        self.quotas[name] = {"cpu": str(2 * slices), "memory": f"{4 * slices}Gi"}

    def edit(self, name: str, placement: dict[str, int]) -> None:
        self.annotations[name][PLACEMENTS_ANNOTATION] = json.dumps(placement)

    def clear(self, name: str) -> None:
        self.annotations[name].pop(PLACEMENTS_ANNOTATION, None)

    def reslice(self, name: str) -> None:  # refused (InvalidSlice) while placed with the old one
        self.annotations[name][SLICE_ANNOTATION] = json.dumps({"cpu": "1", "memory": "2Gi"})

    def remove(self, name: str) -> None:
        self.annotations.pop(name, None)
        self.quotas.pop(name, None)

    def pass_(self) -> PoolPassResult:
        result = PoolPassResult(policy=self.policy, live=[], snapshot=[
            PoolClusterRecord(name=c.name, health=c.health, allocatable=c.allocatable.to_kubernetes(),
                              headroom=c.headroom.to_kubernetes()) for c in CLUSTERS])  # fmt: skip
        placements = {name: placement_of(a) for name, a in self.annotations.items()}
        slices = {name: s for name, a in self.annotations.items() if (s := held_slice(a)) is not None}
        for name in sorted(self.annotations):  # created in name order
            annotations = self.annotations[name]
            read = dict(annotations)  # as the pass read it: the activity's writes go to the API server
            decision = decide_namespace(name=name, annotations=annotations, hards=[self.quotas[name]], clusters=CLUSTERS,
                                        held=placements, slices=slices, pool_policy=self.policy)  # fmt: skip
            if isinstance(decision, Place):
                written = json.dumps(decision.placement, sort_keys=True)
                annotations.update({PLACEMENTS_ANNOTATION: written, SCHEDULED_ANNOTATION: written,
                                    PLACED_SLICE_ANNOTATION: json.dumps(decision.slice.to_kubernetes(), sort_keys=True),
                                    PLACEMENT_STATUS_ANNOTATION: placement_status(decision)})  # fmt: skip
                mandatory = mandatory_annotation(decision)
                if mandatory is None:
                    annotations.pop(MANDATORY_ANNOTATION, None)
                else:
                    annotations[MANDATORY_ANNOTATION] = mandatory
                placements[name], slices[name] = decision.placement, decision.slice
            elif isinstance(decision, Refuse):
                annotations[PLACEMENT_STATUS_ANNOTATION] = placement_status(decision)
            else:
                assert isinstance(decision, Keep)
            assert result.live is not None
            result.live.append(live_entry(name, read, [self.quotas[name]], decision, placements[name]))
        self.facts.append(Fact(at=T0 + timedelta(minutes=len(self.facts)), kind="pool",
                               value=result.model_dump(mode="json")))  # fmt: skip
        return result


Event = tuple[str, str, int]
# What users do to a pool: namespaces come (some with a policy of their own), grow and shrink, go; a user
# writes a placement (one that may not fit), clears one, or changes a placed namespace's slice (refused).
events = st.lists(st.tuples(st.sampled_from(["add", "add", "add-own", "resize", "remove", "edit", "clear", "reslice"]),
                            st.sampled_from("abcdef"), st.integers(min_value=1, max_value=5)),
                  min_size=1, max_size=16)  # fmt: skip


def _run(history: list[Event], *policies: Policy) -> list[Pool]:
    """The same history in a pool per policy, in lockstep. What a user writes about a placement (an edit, a
    clear, a new slice for a placed namespace) reacts to the placement, so it happens only where it means
    the same in every pool: an edit that differs from the placement, a clear or a new slice of a placed one."""
    pools = [Pool(policy) for policy in policies]
    for pool in pools:
        pool.pass_()  # an empty pool first: the replay starts from nothing placed
    for kind, name, n in history:
        there = name in pools[0].annotations
        placed = there and all(placement_of(pool.annotations[name]) for pool in pools)
        edit = {"s3": n} if n % 2 else {"s1": 1, "s3": n // 2}
        edits = placed and all(placement_of(pool.annotations[name]) != edit for pool in pools)
        for pool in pools:
            if kind in ("add", "add-own") and not there:
                pool.add(name, n, own_policy=("spread" if n % 2 else "pack") if kind == "add-own" else None)
            elif kind == "resize" and there:
                pool.resize(name, n)
            elif kind == "remove":
                pool.remove(name)
            elif kind == "edit" and edits:
                pool.edit(name, edit)
            elif kind == "clear" and placed:
                pool.clear(name)
            elif kind == "reslice" and placed:
                pool.reslice(name)
        for pool in pools:
            pool.pass_()
    return pools


@settings(max_examples=300, deadline=None)
@given(events, st.sampled_from(["spread", "pack"]))
# An edit that did not fit under pack (it stands, refused, pass after pass) and was placed under spread.
@example([("add", "a", 1), ("add", "b", 1), ("add", "c", 3), ("add", "d", 1), ("edit", "d", 3), ("resize", "c", 4)],
         "pack")
def test_a_history_replayed_under_another_policy_places_what_the_scheduler_places_under_it(
    history: list[Event], recorded: Policy,
) -> None:
    other: Policy = "pack" if recorded == "spread" else "spread"
    then, actual = _run(history, recorded, other)
    replayed = simulate_pool("pool", then.facts, policy=other)
    itself = simulate_pool("pool", then.facts, policy=recorded)
    assert replayed.passes == itself.passes == len(then.facts)
    last_then, last_other = then.facts[-1].value["live"], actual.facts[-1].value["live"]
    then_rows = {n.namespace: n for n in itself.namespaces}
    other_rows = {n.namespace: n for n in replayed.namespaces}
    for entry in last_then:
        # Under its own policy the replay changes nothing; under the other, it is the scheduler's placement.
        assert then_rows[entry["namespace"]].would == then_rows[entry["namespace"]].then
        assert not then_rows[entry["namespace"]].differs
    for entry in last_other:
        assert other_rows[entry["namespace"]].would_placement == entry["placement"], (history, entry)
    assert itself.differing == 0
    assert replayed.placed_would == sum(1 for e in last_other if sum(e["placement"].values()) == e["slices"])


def test_pack_against_a_spread_history_hand_computed() -> None:
    """s1 holds 4 slices, s2 6, s3 3; a, b, c ask for 2 each, one pass apart.
    Spread (most room left, then fewest held, then name): a → s2 2; b → s1 (tie with s2, by name), then s2;
    c → s1 (three-way tie), then s2 (tie with s3). Pack (already used, in use, evenly free, least room):
    a → s3 (least room), s3 again; b → s3 (in use, its last slice), then s1 (least room of the unused);
    c → s1 (in use), s1 again."""
    pool = Pool("spread")
    pool.pass_()
    for name in "abc":
        pool.add(name, 2)
        pool.pass_()
    pack = simulate_pool("pool", pool.facts, policy="pack")
    rows = {n.namespace: n for n in pack.namespaces}
    assert [rows[name].then for name in "abc"] == ["s2 2", "s1 1, s2 1", "s1 1, s2 1"]
    assert [rows[name].would for name in "abc"] == ["s3 2", "s1 1, s3 1", "s1 2"]
    assert (pack.differing, pack.passes) == (3, 4)
    assert (pack.placed_then, pack.placed_would) == (3, 3)
    assert pack.quota_then == pack.quota_would == {"cpu": "12", "memory": "24Gi"}
    assert (pack.clusters_then, pack.clusters_would) == (2, 2)
    text = pack.render()
    assert "3 of 3 namespaces would have been placed otherwise" in text
    assert "placed at the last pass: 3 → 3 namespaces; quota cpu 12 → 12, memory 24Gi → 24Gi" in text


def test_a_users_placement_and_a_namespaces_own_policy_stand_under_any_policy() -> None:
    pool = Pool("spread")
    pool.pass_()
    pool.add("mine", 2, chosen={"s3": 2})
    pool.add("own", 2, own_policy="spread")
    pool.pass_()
    pack = simulate_pool("pool", pool.facts, policy="pack")
    rows = {n.namespace: n for n in pack.namespaces}
    assert rows["mine"].then == rows["mine"].would == "s3 2"
    assert rows["own"].then == rows["own"].would  # its own annotation says spread
    assert pack.differing == 0


def test_refusals_no_policy_changes_are_kept_and_passes_without_inputs_are_counted() -> None:
    pool = Pool("spread")
    pool.pass_()
    pool.add("bad", 2)
    pool.annotations["bad"][SLICE_ANNOTATION] = "{not json"
    pool.add("big", 20)  # 40 cpu: fits under no policy
    pool.pass_()
    old = Fact(at=T0 - timedelta(minutes=5), kind="pool", value=PoolPassResult(clusters={"s1": "Ready"}).model_dump(mode="json"))
    pack = simulate_pool("pool", [old, *pool.facts], policy="pack")
    rows = {n.namespace: n for n in pack.namespaces}
    assert rows["bad"].then == rows["bad"].would == "refused (InvalidSlice)"
    assert rows["big"].then == rows["big"].would == "not placed"
    assert (pack.not_replayable, pack.passes) == (1, 2)
    assert "1 passes recorded without their inputs, not replayed" in pack.render()
    since = simulate_pool("pool", [old, *pool.facts], policy="pack", since=T0)
    assert since.not_replayable == 0
    with pytest.raises(ValueError, match="policy must be one of pack, spread"):
        simulate_pool("pool", pool.facts, policy="binpack")  # type: ignore[arg-type]


def test_a_pass_records_its_inputs_only_up_to_its_bounds() -> None:
    from models.pool.result import MAX_POOL_CLUSTERS, MAX_POOL_ENTRIES

    assert (MAX_POOL_ENTRIES, MAX_POOL_CLUSTERS) == (500, 100)
    entry = Pool("spread")
    entry.pass_()
    entry.add("a-namespace-of-twenty", 3)
    recorded = entry.pass_()
    assert recorded.live is not None
    size = len(recorded.live[0].model_dump_json())
    assert size < 200, size  # docs/explain.md: about 180 bytes per namespace


@pytest.mark.tenants
def test_tenants_namespaces_of_one_name_are_replayed_apart_on_one_capacity_account_and_named_by_tenant() -> None:
    """As the hand-computed pack above: a/shop → s3 2 (least room); b/shop → s3 (in use, its last slice), then
    s1: the same super clusters' room, whoever's namespace it is."""
    pool = Pool("spread")
    pool.pass_()
    for tenant in "ab":
        pool.add(f"{tenant}/shop", 2)
        pool.pass_()
    pack = simulate_pool("pool", pool.facts, policy="pack")
    assert [(n.tenant, n.namespace, n.would) for n in pack.namespaces] == [("a", "shop", "s3 2"), ("b", "shop", "s1 1, s3 1")]
    lines = pack.render().splitlines()
    assert lines[2].split() == ["tenant", "namespace", "slices", "then", "would"]
    assert lines[3].split()[:2] == ["a", "shop"] and lines[4].split()[:2] == ["b", "shop"]
