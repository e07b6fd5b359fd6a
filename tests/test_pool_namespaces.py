"""The namespace decision (models/pool/namespaces.py): who wrote the placement, whether the slice changed,
keep / refuse / place, and the Placed status it writes. Pure: no cluster."""

from __future__ import annotations

import json

import pytest

from models.names import (
    MANDATORY_ANNOTATION,
    PLACED_SLICE_ANNOTATION,
    PLACEMENT_STATUS_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    POLICY_ANNOTATION,
    SCHEDULED_ANNOTATION,
    SLICE_ANNOTATION,
)
from models.pool.health import HealthState
from models.pool.namespaces import (
    Keep,
    NamespaceDecision,
    Place,
    Refuse,
    decide_namespace,
    held_slice,
    mandatory_annotation,
    placement_author,
    placement_status,
    slice_change,
)
from models.pool.placement import ClusterSnapshot, Policy
from models.resources import Resources

pytestmark = pytest.mark.pool
SLICE = '{"cpu": "1", "memory": "1Gi"}'
HARDS = [{"cpu": "2", "memory": "2Gi"}]  # two slices
CLUSTERS = [ClusterSnapshot("s1", "Ready", Resources(cpu="8", memory="8Gi"), Resources(), Resources()),
            ClusterSnapshot("s2", "Ready", Resources(cpu="8", memory="8Gi"), Resources(), Resources())]  # fmt: skip


def decide(annotations: dict[str, str]) -> NamespaceDecision:
    return decide_namespace(name="shop", annotations=annotations, hards=HARDS, clusters=CLUSTERS, held={},
                            slices={}, pool_policy="spread")  # fmt: skip


@pytest.mark.parametrize(
    ("current", "scheduled", "author"),
    [
        pytest.param({}, {}, "Nobody", id="never placed"),
        pytest.param({}, {"s1": 2}, "Nobody", id="a placement the user cleared"),
        pytest.param({"s1": 2}, {"s1": 2}, "Scheduler", id="the scheduler's own write"),
        pytest.param({"s2": 2}, {"s1": 2}, "User", id="a placement the user edited"),
    ],
)  # fmt: skip
def test_who_wrote_the_placement(current: dict[str, int], scheduled: dict[str, int], author: str) -> None:
    assert placement_author(current=current, scheduled=scheduled) == author


@pytest.mark.parametrize(
    ("current", "placed", "change"),
    [
        pytest.param({}, Resources(cpu="2"), "NotPlaced", id="not placed: any slice goes"),
        pytest.param({"s1": 1}, None, "Unchanged", id="placed before the placed slice was recorded"),
        pytest.param({"s1": 1}, Resources(cpu="1"), "Unchanged", id="the same slice"),
        pytest.param({"s1": 1}, Resources(cpu="2"), "Changed", id="a slice changed after placement"),
    ],
)  # fmt: skip
def test_whether_the_slice_changed(current: dict[str, int], placed: Resources | None, change: str) -> None:
    assert slice_change(current=current, placed_slice=placed, slice_=Resources(cpu="1")) == change


def test_an_unplaced_namespace_is_placed_and_its_status_says_scheduled() -> None:
    decision = decide({SLICE_ANNOTATION: SLICE})
    assert isinstance(decision, Place) and decision.placement == {"s1": 1, "s2": 1}
    assert json.loads(placement_status(decision)) == {"type": "Placed", "status": "True", "reason": "Scheduled",
                                                      "message": "2 slices placed (spread)"}  # fmt: skip


def test_our_own_placement_on_ready_clusters_is_kept_without_a_write() -> None:
    placed = json.dumps({"s1": 2})
    assert decide({SLICE_ANNOTATION: SLICE, PLACEMENTS_ANNOTATION: placed, SCHEDULED_ANNOTATION: placed}) == Keep()


def test_a_users_edit_is_kept_as_mandatory() -> None:
    decision = decide({SLICE_ANNOTATION: SLICE, PLACEMENTS_ANNOTATION: '{"s2": 2}', SCHEDULED_ANNOTATION: '{"s1": 2}'})
    assert isinstance(decision, Place) and decision.placement == {"s2": 2}


def test_a_slice_changed_after_placement_is_refused_with_its_reason_in_the_status() -> None:
    placed = json.dumps({"s1": 2})
    decision = decide({SLICE_ANNOTATION: SLICE, PLACEMENTS_ANNOTATION: placed, SCHEDULED_ANNOTATION: placed,
                       PLACED_SLICE_ANNOTATION: '{"cpu": "500m", "memory": "512Mi"}'})  # fmt: skip
    assert isinstance(decision, Refuse) and decision.reason == "InvalidSlice"
    status = json.loads(placement_status(decision))
    assert (status["status"], status["reason"], status["clusters"]) == ("False", "InvalidSlice", {})
    assert "clear the placement to reschedule" in status["message"]


def test_no_room_is_insufficient_capacity_with_a_reason_per_cluster() -> None:
    decision = decide_namespace(name="shop", annotations={SLICE_ANNOTATION: SLICE}, hards=[{"cpu": "40", "memory": "40Gi"}],
                                clusters=CLUSTERS, held={}, slices={}, pool_policy="spread")  # fmt: skip
    assert isinstance(decision, Refuse) and decision.reason == "InsufficientCapacity"
    assert set(decision.diagnosis) == {"s1", "s2"}


def test_no_room_is_not_refused_while_a_cluster_is_not_probed_yet() -> None:
    """The pass that runs before the prober's first probe waits for it instead of refusing (a Warning, a
    failure counted) what the unprobed cluster may hold."""
    unprobed = [CLUSTERS[0], ClusterSnapshot("s3", "Unknown", Resources(), Resources(), Resources())]
    decision = decide_namespace(name="shop", annotations={SLICE_ANNOTATION: SLICE}, hards=[{"cpu": "40", "memory": "40Gi"}],
                                clusters=unprobed, held={}, slices={}, pool_policy="spread")  # fmt: skip
    assert decision == Keep()
    placed = decide_namespace(name="shop", annotations={SLICE_ANNOTATION: SLICE}, hards=HARDS, clusters=unprobed,
                              held={}, slices={}, pool_policy="spread")  # fmt: skip
    assert isinstance(placed, Place) and placed.placement == {"s1": 2}  # what fits now is placed at once


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param('{"cpu": "lots"}', id="a quantity that is not one"),
        pytest.param('{"cpu": [1]}', id="a list for a quantity"),
        pytest.param("[1]", id="JSON that is not an object"),
        pytest.param("{cpu: 1", id="not JSON"),
    ],
)  # fmt: skip
def test_a_garbage_placed_slice_is_refused_as_invalid_slice_and_holds_nothing(garbage: str) -> None:
    placed = json.dumps({"s1": 2})
    annotations = {SLICE_ANNOTATION: SLICE, PLACEMENTS_ANNOTATION: placed, SCHEDULED_ANNOTATION: placed,
                   PLACED_SLICE_ANNOTATION: garbage}  # fmt: skip
    decision = decide(annotations)
    assert isinstance(decision, Refuse) and decision.reason == "InvalidSlice"
    assert PLACED_SLICE_ANNOTATION in decision.message and "clear the placement to reschedule" in decision.message
    assert held_slice(annotations) is None


@pytest.mark.federation
def test_a_namespace_without_a_slice_whose_quota_is_smaller_than_the_default_is_placed_as_one_slice() -> None:
    decision = decide_namespace(name="shop", annotations={}, hards=[{"cpu": "1", "memory": "512Mi"}],
                                clusters=CLUSTERS, held={}, slices={}, pool_policy="spread")  # fmt: skip
    assert isinstance(decision, Place) and decision.count == 1 and sum(decision.placement.values()) == 1
    assert decision.slice == Resources(cpu="1", memory="512Mi")


@pytest.mark.federation
def test_a_placed_namespace_without_a_slice_keeps_its_slice_when_its_quota_grows() -> None:
    placed = json.dumps({"s1": 1})
    decision = decide_namespace(
        name="shop", hards=[{"cpu": "3", "memory": "1536Mi"}], clusters=CLUSTERS, held={}, slices={}, pool_policy="pack",
        annotations={PLACEMENTS_ANNOTATION: placed, SCHEDULED_ANNOTATION: placed,
                     PLACED_SLICE_ANNOTATION: '{"cpu": "1", "memory": "512Mi"}'},
    )  # fmt: skip
    assert isinstance(decision, Place) and decision.slice == Resources(cpu="1", memory="512Mi")
    assert decision.placement == {"s1": 3}  # three slices of the placed size, not one of a new size


@pytest.mark.federation
def test_a_default_slice_that_fits_nowhere_names_the_annotation_that_sets_a_smaller_one() -> None:
    small = [ClusterSnapshot(c, "Ready", Resources(cpu="1500m", memory="8Gi"), Resources(), Resources()) for c in ("s1", "s2")]
    decision = decide_namespace(name="shop", annotations={}, hards=[{"cpu": "2", "memory": "4Gi"}], clusters=small,
                                held={}, slices={}, pool_policy="spread")  # fmt: skip
    assert isinstance(decision, Refuse) and decision.reason == "InsufficientCapacity"
    assert decision.message.endswith(
        '(the default slice, {"cpu": "2", "memory": "4Gi"}; a smaller one in the pool.tidepool.io/slice annotation '
        "may fit)"
    )
    annotated = decide_namespace(name="shop", annotations={SLICE_ANNOTATION: '{"cpu": "1", "memory": "2Gi"}'},
                                 hards=[{"cpu": "2", "memory": "4Gi"}], clusters=small, held={}, slices={},
                                 pool_policy="spread")  # fmt: skip
    assert isinstance(annotated, Place) and annotated.placement == {"s1": 1, "s2": 1}  # what the hint leads to


def test_a_cleared_placement_with_a_garbage_placed_slice_is_placed_afresh() -> None:
    decision = decide({SLICE_ANNOTATION: SLICE, PLACED_SLICE_ANNOTATION: '{"cpu": "lots"}'})
    assert isinstance(decision, Place) and decision.placement == {"s1": 1, "s2": 1}


def in_pool(s1: HealthState = "Ready", s2: HealthState = "Ready") -> list[ClusterSnapshot]:
    return [ClusterSnapshot("s1", s1, Resources(cpu="8", memory="8Gi"), Resources(), Resources()),
            ClusterSnapshot("s2", s2, Resources(cpu="8", memory="8Gi"), Resources(), Resources())]  # fmt: skip


def decide_in(clusters: list[ClusterSnapshot], annotations: dict[str, str], *, pool_policy: Policy = "spread",
              hards: list[dict[str, str]] = HARDS) -> NamespaceDecision:  # fmt: skip
    return decide_namespace(name="shop", annotations=annotations, hards=hards, clusters=clusters, held={}, slices={},
                            pool_policy=pool_policy)  # fmt: skip


@pytest.mark.failover
@pytest.mark.parametrize(
    ("pool_policy", "annotation", "expected"),
    [
        pytest.param("spread", None, {"s1": 1, "s2": 1}, id="the pool's spread"),
        pytest.param("pack", None, {"s1": 2}, id="the pool's pack"),
        pytest.param("spread", "pack", {"s1": 2}, id="the namespace's pack overrides the pool's spread"),
        pytest.param("pack", "spread", {"s1": 1, "s2": 1}, id="the namespace's spread overrides the pool's pack"),
        pytest.param("pack", " ", {"s1": 2}, id="a blank annotation is the pool's"),
    ],
)  # fmt: skip
def test_the_policy_is_the_namespaces_annotation_else_the_pools(pool_policy: Policy, annotation: str | None,
                                                                expected: dict[str, int]) -> None:  # fmt: skip
    annotations = {SLICE_ANNOTATION: SLICE} | ({POLICY_ANNOTATION: annotation} if annotation is not None else {})
    decision = decide_in(in_pool(), annotations, pool_policy=pool_policy)
    assert isinstance(decision, Place) and decision.placement == expected


@pytest.mark.failover
@pytest.mark.parametrize("garbage", [pytest.param("Pack", id="wrong case"), pytest.param("binpack", id="unknown")])
def test_an_invalid_policy_annotation_is_refused_naming_the_annotation_and_the_rule(garbage: str) -> None:
    decision = decide_in(in_pool(), {SLICE_ANNOTATION: SLICE, POLICY_ANNOTATION: garbage})
    assert isinstance(decision, Refuse) and decision.reason == "InvalidPolicy"
    assert decision.message == (f"the pool.tidepool.io/policy annotation must be spread or pack (or absent: the pool's "
                                f"policy), got {garbage!r}")  # fmt: skip
    assert json.loads(placement_status(decision))["reason"] == "InvalidPolicy"


@pytest.mark.failover
def test_a_users_edit_is_honoured_and_recorded_as_mandatory() -> None:
    decision = decide_in(in_pool(), {SLICE_ANNOTATION: SLICE, PLACEMENTS_ANNOTATION: '{"s2": 2}',
                                     SCHEDULED_ANNOTATION: '{"s1": 2}'})  # fmt: skip
    assert isinstance(decision, Place) and decision.placement == {"s2": 2} and decision.mandatory == {"s2": 2}
    assert mandatory_annotation(decision) == '{"s2": 2}'


def honoured(placement: str, mandatory: str, **more: str) -> dict[str, str]:
    """A user's placement the scheduler wrote back as its own, with the mandatory annotation."""
    return {SLICE_ANNOTATION: SLICE, PLACEMENTS_ANNOTATION: placement, SCHEDULED_ANNOTATION: placement,
            MANDATORY_ANNOTATION: mandatory, **more}  # fmt: skip


@pytest.mark.failover
def test_a_mandatory_placement_on_an_unreachable_cluster_waits_for_it_with_its_reason() -> None:
    decision = decide_in(in_pool(s2="Unreachable"), honoured('{"s2": 2}', '{"s2": 2}'))
    assert isinstance(decision, Refuse) and decision.reason == "WaitingForCluster"
    assert decision.message.startswith("the placement a user chose names s2, unreachable: waiting for it")
    assert decision.diagnosis["s2"].startswith("Unreachable: ")
    fresh_edit = decide_in(in_pool(s2="Unreachable"), {SLICE_ANNOTATION: SLICE, PLACEMENTS_ANNOTATION: '{"s2": 2}',
                                                        SCHEDULED_ANNOTATION: '{"s1": 2}'})  # fmt: skip
    assert isinstance(fresh_edit, Refuse) and fresh_edit.reason == "WaitingForCluster"


@pytest.mark.failover
def test_the_schedulers_own_placement_on_an_unreachable_cluster_moves() -> None:
    placed = json.dumps({"s2": 2})
    decision = decide_in(in_pool(s2="Unreachable"), {SLICE_ANNOTATION: SLICE, PLACEMENTS_ANNOTATION: placed,
                                                      SCHEDULED_ANNOTATION: placed})  # fmt: skip
    assert isinstance(decision, Place) and decision.placement == {"s1": 2} and decision.mandatory == {}


@pytest.mark.failover
@pytest.mark.parametrize("health", [pytest.param("Suspect", id="Suspect"), pytest.param("Unknown", id="not probed")])
def test_a_blip_keeps_every_placement_without_a_write(health: HealthState) -> None:
    placed = json.dumps({"s2": 2})
    ours = {SLICE_ANNOTATION: SLICE, PLACEMENTS_ANNOTATION: placed, SCHEDULED_ANNOTATION: placed}
    assert decide_in(in_pool(s2=health), ours) == Keep()
    assert decide_in(in_pool(s2=health), honoured(placed, placed)) == Keep()


@pytest.mark.failover
def test_a_mandatory_placement_whose_cluster_came_back_is_kept_and_its_status_says_scheduled_again() -> None:
    waiting = json.dumps({"type": "Placed", "status": "False", "reason": "WaitingForCluster", "message": "",
                          "clusters": {}})  # fmt: skip
    decision = decide_in(in_pool(), honoured('{"s2": 2}', '{"s2": 2}', **{PLACEMENT_STATUS_ANNOTATION: waiting}))
    assert isinstance(decision, Place) and decision.placement == {"s2": 2} and decision.mandatory == {"s2": 2}
    assert json.loads(placement_status(decision))["reason"] == "Scheduled"


@pytest.mark.failover
def test_a_mandatory_placement_stays_when_the_quota_grows_and_the_new_slices_are_scheduled() -> None:
    decision = decide_in(in_pool(), honoured('{"s2": 2}', '{"s2": 2}'), pool_policy="pack",
                         hards=[{"cpu": "4", "memory": "4Gi"}])  # fmt: skip
    assert isinstance(decision, Place) and decision.placement == {"s2": 4} and decision.mandatory == {"s2": 2}


@pytest.mark.failover
def test_a_cleared_placement_forgets_the_mandatory_one() -> None:
    annotations = honoured('{"s2": 2}', '{"s2": 2}')
    del annotations[PLACEMENTS_ANNOTATION]
    decision = decide_in(in_pool(s2="Unreachable"), annotations)
    assert isinstance(decision, Place) and decision.placement == {"s1": 2} and decision.mandatory == {}
    assert mandatory_annotation(decision) is None
