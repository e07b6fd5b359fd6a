"""The saga's pure decisions (models/pool/moves.py): what drains, which pods move, when a move is over, and
what a tenant pod says meanwhile. No clusters."""

from __future__ import annotations

import pytest

from models.api.conditions import POD_SUPER_CLUSTER_CONDITION
from models.names import DRAINING_ANNOTATION
from models.pods import says
from models.pool.moves import (
    PodView,
    drain_after,
    draining_of,
    finished_clusters,
    holding,
    moved_from,
    must_move,
    ready_again_status,
    recreating_status,
    unreachable_status,
)
from models.pool.sync import in_scope

pytestmark = [pytest.mark.pool, pytest.mark.failover]
NOW = "2026-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("previous", "placement", "draining", "expected"),
    [
        pytest.param({"s1": 2}, {"s2": 2}, {}, {"s1": 2}, id="a cluster that leaves the placement drains all its slices"),
        pytest.param({"s1": 3}, {"s1": 1}, {}, {"s1": 2}, id="a shrink drains the slices it drops"),
        pytest.param({"s1": 1}, {"s1": 1, "s2": 1}, {}, {}, id="a grow drains nothing"),
        pytest.param({"s2": 1}, {"s3": 1}, {"s1": 1}, {"s1": 1, "s2": 1},
                     id="a second move before the first ended drains both"),
        pytest.param({}, {"s2": 1}, {}, {}, id="a first placement drains nothing"),
    ],
)
def test_what_drains_after_a_new_placement(previous: dict[str, int], placement: dict[str, int],
                                           draining: dict[str, int], expected: dict[str, int]) -> None:  # fmt: skip
    assert drain_after(previous=previous, placement=placement, draining=draining) == expected


def test_a_namespace_holds_its_placement_and_what_drains_until_the_move_ends() -> None:
    assert holding({"s2": 1}, {"s1": 2, "s2": 1}) == {"s1": 2, "s2": 2}


@pytest.mark.parametrize("text", ["garbage", "[1]", '{"s1": "2"}', '{"s1": 0}', '{"s1": true}'])
def test_a_draining_annotation_that_cannot_be_read_holds_nothing(text: str) -> None:
    assert draining_of({DRAINING_ANNOTATION: text}) == {}


def _pod(name: str, cluster: str | None, *, moved_from: str | None = None, phase: str | None = "Running",
         deleting: bool = False) -> PodView:  # fmt: skip
    return PodView(name=name, cluster=cluster, moved_from=moved_from, phase=phase, deleting=deleting)


@pytest.mark.parametrize(
    ("pod", "moves"),
    [
        pytest.param(_pod("a", "s1"), True, id="a running pod on a cluster that left the placement moves"),
        pytest.param(_pod("a", "s2"), False, id="a pod on the placement stays"),
        pytest.param(_pod("a", "s1", phase="Succeeded"), False, id="a pod that ended does not move"),
        pytest.param(_pod("a", "s1", deleting=True), False, id="a pod being deleted does not move"),
        pytest.param(_pod("a", None, phase="Pending"), False, id="a pod never placed is the pass's, not a move"),
    ],
)
def test_which_pods_move(pod: PodView, moves: bool) -> None:
    assert must_move(pod, {"s2": 1}) is moves


@pytest.mark.parametrize(
    ("pods", "finished"),
    [
        pytest.param([_pod("a", "s2", moved_from="s1", phase="Pending")], [],
                     id="a moved pod not running yet keeps its old cluster draining"),
        pytest.param([_pod("a", "s2", moved_from="s1")], ["s1"], id="every moved pod running: the move is over"),
        pytest.param([_pod("a", "s2", moved_from="s1", phase="Failed")], ["s1"], id="a moved pod that ended blocks nothing"),
        pytest.param([_pod("a", "s1")], [], id="a pod that fits nowhere else keeps its cluster draining"),
        pytest.param([], ["s1"], id="a namespace without pods finishes at once"),
    ],
)
def test_when_a_move_is_over(pods: list[PodView], finished: list[str]) -> None:
    assert finished_clusters(draining={"s1": 1}, placement={"s2": 1}, pods=pods) == finished


def test_a_shrunk_cluster_still_in_the_placement_finishes_with_its_pods_still_there() -> None:
    assert finished_clusters(draining={"s1": 2}, placement={"s1": 1}, pods=[_pod("a", "s1")]) == ["s1"]


def test_a_pod_being_recreated_is_pending_not_ready_and_says_where() -> None:
    status = recreating_status(old="s1", new="s2", now=NOW)
    assert status["phase"] == "Pending" and status["reason"] == "Recreating" and "s2" in status["message"]
    assert status["containerStatuses"] is None  # the old copy's containers are not this pod's any more
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Ready": "False",
                                                                      POD_SUPER_CLUSTER_CONDITION: "False"}


def test_a_pod_on_an_unreachable_cluster_says_so_once() -> None:
    patch = unreachable_status(cluster="s1", why="s2: InsufficientQuota", now=NOW)
    assert patch["reason"] == "SuperClusterUnreachable" and "s1" in patch["message"]
    written = {"phase": "Running", **patch, "conditions": [{**patch["conditions"][0], "lastTransitionTime": "earlier"}]}
    assert says(written, unreachable_status(cluster="s1", why="s2: InsufficientQuota", now="later"))
    assert not says(written, ready_again_status(cluster="s1", now=NOW))


@pytest.mark.parametrize(
    ("placement", "scheduled", "draining", "here"),
    [
        pytest.param({"s2": 1}, {"s1": 1}, {}, True,
                     id="a user's edit takes nothing away before the scheduler has made it a move"),
        pytest.param({}, {"s1": 1}, {}, True, id="a cleared placement takes nothing away either"),
        pytest.param({"s2": 1}, {"s2": 1}, {"s1": 1}, True, id="a cluster stays while the namespace drains from it"),
        pytest.param({"s2": 1}, {"s2": 1}, {}, False, id="once the move ended the cluster drops the namespace"),
    ],
)
def test_which_namespaces_a_syncer_keeps(placement: dict[str, int], scheduled: dict[str, int],
                                        draining: dict[str, int], here: bool) -> None:  # fmt: skip
    assert in_scope(placement, "s1", pooling=True, scheduled=scheduled, draining=draining) is here


def test_a_pod_keeps_the_copy_that_runs_while_it_moves_and_none_when_it_goes_back() -> None:
    first = PodView(name="p", cluster="a", moved_from=None, phase="Running")
    assert moved_from(first, new="b") == "a"
    on_its_way = PodView(name="p", cluster="b", moved_from="a", phase="Pending")  # b's copy never ran
    assert moved_from(on_its_way, new="c") == "a"
    assert moved_from(on_its_way, new="a") is None  # back where it runs: a's syncer owns it again
    running_again = PodView(name="p", cluster="b", moved_from="a", phase="Running")  # b's copy runs
    assert moved_from(running_again, new="c") == "b"


def test_a_pod_status_that_carries_a_condition_of_its_own_already_says_the_copy_s() -> None:
    copy = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}], "reason": None}
    tenant = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"},
                                                 {"type": "pool.tidepool.io/SuperClusterReady", "status": "True"}]}
    assert says(tenant, copy)
    assert not says({**tenant, "phase": "Pending"}, copy)

