"""models/explain.py: the offer's derivation and the stories told from decoded history facts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from models.explain import (
    AmbiguousNamespace,
    Fact,
    OfferDerivation,
    PlacedPod,
    advertisement_story,
    namespace_story,
    offloaded_pod_story,
    peering_story,
    pod_story,
    pool_namespace,
    virtual_node_provider,
)
from models.resources import Resources

pytestmark = pytest.mark.explain

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
DERIVATION = OfferDerivation(allocatable=Resources(cpu="8", memory="16Gi", pods="110"),
                             used=Resources(cpu="2", memory="1Gi", pods="1"),
                             consumer_own=Resources(cpu="1", pods="1"), sharing_percentage=50,
                             advertised=Resources(cpu="3", memory="7680Mi", pods="54"))  # fmt: skip


def test_the_derivation_shows_each_resource_its_rounding_and_what_the_consumer_runs_itself() -> None:
    assert DERIVATION.lines() == [
        "cpu: (8 − 2) × 50% = 3",
        "memory: (16Gi − 1Gi) × 50% = 7680Mi",
        "pods: (110 − 1) × 50% = 54 (rounded down from 54.5)",
        "not counted as used: the consumer's own offloaded pods, cpu 1, pods 1",
    ]


def test_the_derivation_goes_through_its_annotation_and_a_bad_one_is_none() -> None:
    assert OfferDerivation.from_annotation(DERIVATION.to_annotation()) == DERIVATION
    assert '"consumerOwn"' in DERIVATION.to_annotation() and '"sharingPercentage": 50' in DERIVATION.to_annotation()
    for bad in (None, "", "not json", '{"allocatable": {"cpu": "x"}}', '{"sharingPercentage": 101}'):
        assert OfferDerivation.from_annotation(bad) is None


def _push(at: datetime, percent: int, cpu: str, phase: str | None = "Accepted") -> Fact:
    return Fact(at=at, kind="push", name="push_advertisement", value={
        "advertised": {"cpu": cpu}, "allocatable": {"cpu": "8"}, "used": {"cpu": "2"}, "consumer_own": {},
        "sharing_percentage": percent, "configured_percentage": percent, "foreign_phase": phase,
        "timestamp": at.isoformat(), "time_to_live": (at + timedelta(minutes=30)).isoformat()})  # fmt: skip


def test_the_peering_story_collapses_repeated_offers_and_tells_each_change_with_its_cause() -> None:
    facts = [
        Fact(at=T0, kind="started", name="PeeringWorkflow", value={"foreign_cluster_id": "c"}),
        _push(T0, 50, "3", phase=None),
        _push(T0 + timedelta(minutes=10), 50, "3"),
        _push(T0 + timedelta(minutes=20), 50, "3"),
        Fact(at=T0 + timedelta(minutes=25), kind="signal", name="set_sharing_percentage", value=25),
        _push(T0 + timedelta(minutes=25), 25, "1500m"),
    ]
    story = peering_story("peering with c", "p", ["peering-c@p"], facts)
    assert [e.what for e in story.entries] == [
        "peering started",
        "offered cpu 3",
        "the foreign cluster's decision: Accepted",
        "(then 2 more pushes offering the same, the last at this time)",
        "sharing percentage set to 25% by signal set_sharing_percentage",
        "offered cpu 1500m",
    ]
    assert story.entries[1].why == ["sharing percentage 50% (the ClusterConfig's)", "cpu: (8 − 2) × 50% = 3"]
    assert story.entries[-1].why[1] == "cpu: (8 − 2) × 25% = 1500m"
    assert story.now[0] == "offer: cpu 1500m"
    assert "offered cpu 1500m" in story.render()


def test_the_advertisement_story_tells_the_admission_decision_its_inputs_and_the_offer() -> None:
    record = {"advertisement": "advertisement-p", "provider": "p", "phase": "Accepted", "reason": "WithinMaximum",
              "message": "accepted as number 1 of at most 2 (maxAcceptableAdvertisements)", "position": 1,
              "arrived": T0.isoformat()}  # fmt: skip
    other = {**record, "advertisement": "advertisement-q", "provider": "q", "position": 2}
    facts = [
        Fact(at=T0, kind="admission", value={"policy": "AutoAcceptMax", "maximum": 2, "records": [record, other]}),
        Fact(at=T0, kind="observed", value={"exists": True, "phase": "Accepted", "resources": {"cpu": "3"},
                                            "offer": DERIVATION.model_dump()}),  # fmt: skip
        Fact(at=T0, kind="step", name="EnsureFinalizer"),
    ]
    story = advertisement_story("Advertisement from p", "c", "advertisement-p", ["admission-c"], facts)
    assert [e.what for e in story.entries] == ["admission: Accepted (WithinMaximum)", "offer seen: cpu 3",
                                               "step EnsureFinalizer"]  # fmt: skip
    assert story.entries[0].why == [record["message"], "policy AutoAcceptMax, maxAcceptableAdvertisements 2; "
                                    "number 1 in arrival order (arrived 2026-11-25 12:00:00 UTC)"]  # fmt: skip
    assert story.entries[1].why[1:] == DERIVATION.lines()
    assert story.now == ["decision: Accepted (WithinMaximum)", "offer: cpu 3"]


def test_the_namespace_story_tells_each_new_placement_with_every_clusters_reason_and_the_pods() -> None:
    placed = {"namespace": "shop", "placement": {"s1": 3, "s2": 3}, "reason": "6 slices placed (spread)",
              "diagnosis": {"s3": "NotProbed: not probed yet"}, "slice": {"cpu": "1"}, "slices": 6, "mandatory": {"s1": 3}}  # fmt: skip
    passes = [
        Fact(at=T0, kind="pool", value={"clusters": {"s1": "Ready"}, "decisions": [placed, {**placed, "namespace": "other"}],
                                        "pods_placed": {"shop/web": "s2", "other/web": "s1"}}),  # fmt: skip
        Fact(at=T0 + timedelta(minutes=1), kind="pool", value={"decisions": [placed], "pods_placed": {"shop/web": "s2"}}),
        Fact(at=T0 + timedelta(minutes=2), kind="move", name="move_pods",
             value={"namespace": "shop", "moved": {"web": "s2 → s1", "api": "s2 → s1"}}),
    ]
    shop = pool_namespace(passes, "shop")
    story = namespace_story("namespace shop", shop, ["pool-scheduler"], passes)
    assert [e.what for e in story.entries] == ["slices placed: s1 3, s2 3", "pod web → s2",
                                               "move_pods: pods moved off draining clusters"]  # fmt: skip
    assert story.entries[0].why == ["6 slices placed (spread)", "6 slices of cpu 1", "the placement annotation asks for s1 3",
                                    "s3: NotProbed: not probed yet", "s1 was Ready"]  # fmt: skip
    pod = pod_story("pod shop/web", shop, "web", ["pool-scheduler"], passes)
    assert [e.what for e in pod.entries] == [e.what for e in story.entries]
    assert pod.entries[-1].why == ["web: s2 → s1"]  # the other pod's move is not this pod's story
    assert pod.now == ["slices placed: s1 3, s2 3", "pod web on s1"]  # where the move took it


def _pass(at: datetime, *ids: str, cluster: str = "s1") -> Fact:
    """A pass that placed each namespace id (bare, as 0.1 recorded, or `<tenant>/<namespace>`) and its pod web."""
    return Fact(at=at, kind="pool", value={
        "decisions": [{"namespace": i, "placement": {cluster: 1}, "reason": "1 slice placed (spread)"} for i in ids],
        "pods_placed": {f"{i}/web": cluster for i in ids}})  # fmt: skip


@pytest.mark.tenants
@pytest.mark.parametrize(("facts", "tenant", "subject", "now"), [
    pytest.param([_pass(T0, "shop")], None, "shop", ["slices placed: s1 1", "pod web on s1"], id="a 0.1 pass's bare name"),
    pytest.param([_pass(T0, "a/shop", "a/other")], None, "a/shop", ["slices placed: s1 1", "pod web on s1"],
                 id="one tenant's namespace needs no --tenant"),
    pytest.param([_pass(T0, "shop", cluster="s2"), _pass(T0 + timedelta(minutes=1), "a/shop")], None, "a/shop",
                 ["slices placed: s1 1", "pod web on s1"], id="the bare records before the upgrade and the tenant's after"),
    pytest.param([_pass(T0, "a/shop", cluster="s2"), _pass(T0, "b/shop")], "a", "a/shop",
                 ["slices placed: s2 1", "pod web on s2"], id="--tenant picks one of several"),
    pytest.param([_pass(T0, "shop"), _pass(T0, "a/shop")], "b", "b/shop", ["no placement recorded"],
                 id="--tenant of a tenant without it: nothing, not the bare records"),
    pytest.param([_pass(T0, "a/other")], None, "shop", ["no placement recorded"], id="no record of it"),
])  # fmt: skip
def test_a_pool_namespace_is_found_by_its_tenant_and_without_one_when_one_tenant_has_it(
    facts: list[Fact], tenant: str | None, subject: str, now: list[str],
) -> None:
    found = pool_namespace(facts, "shop", tenant=tenant)
    assert found.subject == subject
    assert namespace_story(f"namespace {found.subject}", found, [], facts).now == now


@pytest.mark.tenants
def test_a_namespace_several_tenants_have_needs_tenant_and_the_error_names_them() -> None:
    facts = [_pass(T0, "shop", "b/shop"), Fact(at=T0, kind="move", name="move_pods", value={"namespace": "a/shop"})]
    with pytest.raises(AmbiguousNamespace, match=r"^--tenant is required: shop is a namespace of tenants a, b$"):
        pool_namespace(facts, "shop")


@pytest.mark.tenants
def test_a_pod_story_of_one_tenant_leaves_out_the_same_pod_of_another() -> None:
    facts = [_pass(T0, "a/shop", cluster="s1"), _pass(T0, "b/shop", cluster="s2"),
             Fact(at=T0 + timedelta(minutes=1), kind="move", name="move_pods",
                  value={"namespace": "b/shop", "moved": {"web": "s2 → s3"}})]  # fmt: skip
    pod = pod_story("pod a/shop/web", pool_namespace(facts, "shop", tenant="a"), "web", [], facts)
    assert [e.what for e in pod.entries] == ["slices placed: s1 1", "pod web → s1"]
    assert pod.now == ["slices placed: s1 1", "pod web on s1"]


@pytest.mark.parametrize("text", [
    "[" * 100_000,  # deeper than the JSON parser recurses
    DERIVATION.to_annotation().replace('"cpu": "8"', '"cpu": "1e99999999"'),  # parses; cannot be written back
    DERIVATION.to_annotation() + " " * 5000,  # larger than any derivation: never recorded in every observation
])  # fmt: skip
def test_whatever_a_foreign_cluster_writes_in_the_annotation_is_no_derivation_and_no_failure(text: str) -> None:
    assert OfferDerivation.from_annotation(text) is None


def test_rounding_is_told_in_the_offers_unit_and_more_used_than_allocatable_says_so() -> None:
    derivation = OfferDerivation(allocatable=Resources(cpu="2199m", memory="1Gi"), used=Resources(cpu="1", memory="2Gi"),
                                 sharing_percentage=33, advertised=Resources(cpu="395m"))  # fmt: skip
    assert derivation.lines() == ["cpu: (2199m − 1) × 33% = 395m (rounded down from 395.67m)",
                                  "memory: (1Gi − 2Gi) × 33% = 0 (more is used than allocatable: none to share)"]  # fmt: skip


def test_signals_and_updates_are_told_as_the_workflow_took_them() -> None:
    facts = [Fact(at=T0, kind="signal", name="set_sharing_percentage", value=None),
             Fact(at=T0, kind="update", name="update_sharing_percentage", value=150),
             Fact(at=T0, kind="signal", name="withdraw", value=None),
             Fact(at=T0 + timedelta(seconds=1), kind="completed", name="PeeringWorkflow",
                  value={"foreign_cleaned": True, "home_cleaned": True, "note": ""})]  # fmt: skip
    story = peering_story("peering with c", "p", ["peering-c@p"], [_push(T0, 50, "3"), *facts])
    whats = [e.what for e in story.entries]
    assert "sharing percentage follows the ClusterConfig again by signal set_sharing_percentage" in whats
    assert any(w.startswith("ignored: sharing_percentage must be an integer between 0 and 100, got 150") for w in whats)
    assert "withdrawal asked: Requested" in whats and whats[-1] == "peering withdrawn"
    assert story.now == ["withdrawn 2026-11-25 12:00:01 UTC: nothing offered any more"]


def test_a_manual_refusal_an_unrecorded_decision_and_the_end_of_a_lifecycle_are_told() -> None:
    facts = [Fact(at=T0, kind="admission", value={"records": [], "records_omitted": 150}),
             Fact(at=T0, kind="update", name="refuse", value="too expensive"),
             Fact(at=T0 + timedelta(seconds=1), kind="completed", name="AdvertisementWorkflow",
                  value={"teardown": "Deleted", "deleted": {"advertisement": T0.isoformat()}})]  # fmt: skip
    story = advertisement_story("Advertisement from p", "c", "advertisement-p", ["admission-c"], facts)
    assert [e.what for e in story.entries] == [
        "admission: 150 decisions of this pass not recorded (at most 100 a pass): this Advertisement's may be among them",
        "refused by hand (update refuse)", "lifecycle ended"]  # fmt: skip
    assert story.now == ["lifecycle ended 2026-11-25 12:00:01 UTC: no Advertisement, virtual kubelet or node left"]


def _pod(node: str = "", phase: str = "Pending", unscheduled: str | None = None) -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "False", "message": unscheduled}] if unscheduled else []
    return {"metadata": {"name": "web", "namespace": "shop", "creationTimestamp": "2026-11-25T12:00:00Z"},
            "spec": {"nodeName": node} if node else {}, "status": {"phase": phase, "conditions": conditions}}  # fmt: skip


VIRTUAL_NODE = {"metadata": {"name": "tidepool-a", "labels": {"tidepool.io/provider": "a", "tidepool.io/type": "virtual-node"}}}


def _event(minute: int, reason: str, message: str, *, provider: str | None = None, count: int = 1) -> dict[str, Any]:
    labels = {"tidepool.io/provider": provider} if provider else {}
    stamp = f"2026-11-25T12:{minute:02d}:00Z"
    return {"metadata": {"labels": labels}, "type": "Warning", "reason": reason, "message": message, "count": count,
            "firstTimestamp": "2026-11-25T12:00:30Z", "lastTimestamp": stamp}  # fmt: skip


def test_a_pod_pending_in_its_provider_is_told_with_its_copys_events_and_the_offer_behind_its_node() -> None:
    offer = advertisement_story("Advertisement from a", "b", "advertisement-a", ["admission-b"], [
        Fact(at=T0 - timedelta(minutes=5), kind="admission", value={"policy": "AutoAcceptMax", "maximum": 5, "records": [
            {"advertisement": "advertisement-a", "provider": "a", "phase": "Accepted", "reason": "WithinMaximum",
             "message": "accepted", "position": 1}]})])  # fmt: skip
    events = [_event(2, "FailedScheduling", "0/1 nodes are available: insufficient cpu", provider="a", count=3),
              _event(9, "FailedScheduling", "later", provider="a")]  # fmt: skip
    assert virtual_node_provider(VIRTUAL_NODE) == "a"
    story = offloaded_pod_story("pod shop/web", "b", _pod("tidepool-a"), events, offer,
                                provider=virtual_node_provider(VIRTUAL_NODE), at=T0 + timedelta(minutes=5))  # fmt: skip
    assert [(e.at, e.what) for e in story.entries] == [
        (T0 - timedelta(minutes=5), "Advertisement from a: admission: Accepted (WithinMaximum)"),
        (T0, "pod created"),
        (T0 + timedelta(minutes=2), "Warning FailedScheduling (its copy in a)"),  # the one after --at is left out
    ]
    assert story.entries[2].why == ["0/1 nodes are available: insufficient cpu", "3 times since 2026-11-25 12:00:30 UTC"]
    assert story.now[:3] == ["phase Pending", "on virtual node tidepool-a: runs in provider a",
                             "the provider's Events on its copy above say why it is not running there"]  # fmt: skip
    assert story.now[3] == "its Advertisement: decision: Accepted (WithinMaximum)"


def test_a_pod_not_offloaded_or_not_scheduled_says_so() -> None:
    own_node = {"metadata": {"name": "n1", "labels": {"tidepool.io/provider": "a"}}}  # a label alone makes no virtual node
    assert virtual_node_provider(own_node) is None and virtual_node_provider(None) is None
    own = offloaded_pod_story("pod shop/web", "b", _pod("n1", phase="Running"), [], None, provider=None)
    assert own.now == ["phase Running", "on node n1, one of this cluster's own: not offloaded"]
    waiting = offloaded_pod_story("pod shop/web", "b", _pod(unscheduled="0/2 nodes are available"), [], None,
                                  provider=None)
    assert waiting.now == ["phase Pending", "not scheduled: 0/2 nodes are available"]


@pytest.mark.tenants
def test_a_pod_the_placer_placed_is_told_from_its_event_and_a_pass_s_record_is_not_told_twice() -> None:
    placed_by_pass = _pass(T0, "a/shop")
    only_namespace = Fact(at=T0, kind="pool", value={"decisions": [
        {"namespace": "a/shop", "placement": {"s1": 1}, "reason": "1 slice placed (spread)"}]})  # fmt: skip
    shop = pool_namespace([only_namespace], "shop", tenant="a")
    event = PlacedPod(cluster="s1", at=T0 + timedelta(seconds=5), message="placed on super cluster s1: the most room left")
    story = pod_story("pod a/shop/web", shop, "web", ["pool-scheduler"], [only_namespace], placed=event)
    assert [(e.at, e.what, e.why) for e in story.entries][-1] == (event.at, "pod web → s1", [event.message])
    assert story.now == ["slices placed: s1 1", "pod web on s1"]
    # Without the pod's word, the history's alone: the placer's placement is not there.
    assert pod_story("pod a/shop/web", shop, "web", ["pool-scheduler"], [only_namespace]).now == ["slices placed: s1 1"]
    # A pass placed it: told once, from the history.
    told = pod_story("pod a/shop/web", shop, "web", ["pool-scheduler"], [placed_by_pass], placed=event)
    assert [e.what for e in told.entries].count("pod web → s1") == 1
