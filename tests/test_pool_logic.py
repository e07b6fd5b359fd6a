"""The pool's pure logic: slices (virtualcluster's vectors), namespace placement, pod placement."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.pool.health import HealthState
from models.pool.placement import (
    ClusterSnapshot,
    PlacementRequest,
    Policy,
    first_fit_slices,
    first_fit_whole_quota,
    headroom,
    schedule,
)
from models.pool.pods import WaitingPod, choose_cluster, place_waiting
from models.pool.slicing import (
    SliceError,
    default_slice,
    default_slice_for,
    namespace_quota,
    namespace_slices,
    parse_slice,
    slice_count,
)
from models.resources import Resources

pytestmark = pytest.mark.pool
QUOTA = Resources(cpu="1000m", memory="2Gi")


@pytest.mark.parametrize(
    ("slice_", "count"),
    [
        pytest.param({"cpu": "500m", "memory": "1Gi"}, 2, id="500m/1Gi gives 2"),
        pytest.param({"cpu": "10m", "memory": "1Gi"}, 100, id="10m/1Gi gives 100 (milli-CPU exact)"),
        pytest.param({"cpu": "200m", "memory": "50Mi"}, 41, id="200m/50Mi gives 41"),
        pytest.param({"cpu": "800m", "memory": "800Mi"}, 3, id="800m/800Mi gives 3"),
    ],
)
def test_the_slice_vectors_of_virtualcluster(slice_: dict[str, str], count: int) -> None:
    assert slice_count(QUOTA, Resources(slice_)) == count


@pytest.mark.parametrize(
    ("slice_", "message"),
    [
        pytest.param({"cpu": "2", "memory": "1Gi"}, "bigger than the quota", id="a slice bigger than the quota"),
        pytest.param({"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "1"}, "not in the namespace's quota",
                     id="an extra resource"),
        pytest.param({"cpu": "500m"}, "has no slice size", id="a missing resource"),
        pytest.param({"cpu": "0", "memory": "1Gi"}, "must be positive", id="a zero slice"),
    ],
)  # fmt: skip
def test_bad_slices_are_refused_with_the_rule(slice_: dict[str, str], message: str) -> None:
    with pytest.raises(SliceError, match=message):
        slice_count(QUOTA, Resources(slice_))


def test_the_quota_is_the_largest_hard_over_the_namespaces_quotas_and_the_default_slice_is_fresh() -> None:
    assert namespace_quota([{"cpu": "1", "memory": "1Gi"}, {"requests.cpu": "2", "pods": "10"}]) == Resources(
        cpu="2", memory="1Gi")  # fmt: skip
    default_slice()._items["cpu"] = Decimal(999)  # a caller mutating its copy...
    assert parse_slice(None) == Resources(cpu="2", memory="4Gi")  # ...changes nobody else's
    with pytest.raises(SliceError, match="not a JSON ResourceList"):
        parse_slice("{cpu: 1")


@pytest.mark.federation
@pytest.mark.parametrize(
    ("quota", "placed", "slice_", "count"),
    [
        pytest.param({"cpu": "8", "memory": "16Gi"}, None, {"cpu": "2", "memory": "4Gi"}, 4,
                     id="a quota at least the default: the default, as before"),
        pytest.param({"cpu": "1", "memory": "2Gi"}, None, {"cpu": "1", "memory": "2Gi"}, 1,
                     id="a quota smaller than the default: one slice of it"),
        pytest.param({"cpu": "500m", "memory": "8Gi"}, None, {"cpu": "500m", "memory": "4Gi"}, 2,
                     id="smaller in one resource: capped there only"),
        pytest.param({"cpu": "3"}, None, {"cpu": "2"}, 2, id="only the quota's resources"),
        pytest.param({"cpu": "4", "memory": "8Gi"}, {"cpu": "1", "memory": "2Gi"}, {"cpu": "1", "memory": "2Gi"}, 4,
                     id="a grown quota keeps the placed slice and adds slices"),
        pytest.param({"cpu": "1", "memory": "1Gi"}, {"cpu": "2", "memory": "4Gi"}, {"cpu": "1", "memory": "1Gi"}, 1,
                     id="a quota shrunk below the placed slice: the default again, capped"),
    ],
)  # fmt: skip
def test_the_default_slice_adapts_to_the_quota(
    quota: dict[str, str], placed: dict[str, str] | None, slice_: dict[str, str], count: int
) -> None:
    adapted = default_slice_for(Resources(quota), placed=None if placed is None else Resources(placed))
    assert (adapted, slice_count(Resources(quota), adapted)) == (Resources(slice_), count)


@pytest.mark.federation
def test_an_annotated_slice_is_the_users_and_a_refused_default_says_it_is_the_default() -> None:
    assert namespace_slices(annotation='{"cpu": "250m"}', quota=Resources(cpu="1"), placed=Resources(cpu="1")) == (
        Resources(cpu="250m"), 4)  # fmt: skip
    with pytest.raises(SliceError, match="bigger than the quota"):  # the user's slice is not adapted
        namespace_slices(annotation='{"cpu": "2"}', quota=Resources(cpu="1"), placed=None)
    with pytest.raises(SliceError) as refused:
        namespace_slices(annotation=None, quota=Resources(cpu="0", memory="1Gi"), placed=None)
    assert str(refused.value) == (
        'slice cpu must be positive, got 0 (no pool.tidepool.io/slice annotation: the slice is the default, '
        '{"cpu": "2", "memory": "4Gi"} capped at the quota)'
    )


def cluster(name: str, placed: str = "0", *, health: HealthState = "Ready", cpu: str = "2000m", memory: str = "4Gi",
            headroom: dict[str, str] | None = None) -> ClusterSnapshot:  # fmt: skip
    return ClusterSnapshot(name=name, health=health, allocatable=Resources(cpu=cpu, memory=memory),
                           headroom=Resources(headroom or {}),
                           placed=Resources(cpu=f"{int(placed) * 500}m", memory=f"{int(placed)}Gi"))  # fmt: skip


SLICE = Resources(cpu="500m", memory="1Gi")


@pytest.mark.parametrize(
    ("clusters", "count", "expected"),
    [
        pytest.param([cluster("r1"), cluster("r2")], 2, {"r1": 1, "r2": 1}, id="2 slices spread 1+1"),
        pytest.param([cluster("r1", "2"), cluster("r2", "4")], 2, {"r1": 2}, id="2+0 when only one has room"),
        pytest.param([cluster("r1", "4"), cluster("r2", "4")], 1, None, id="4+4 is full"),
        pytest.param([cluster("r1"), cluster("r2")], 8, {"r1": 4, "r2": 4}, id="8 fill both"),
        pytest.param([cluster("r1"), cluster("r2")], 9, None, id="9 exceed both and nothing partial is returned"),
    ],
)
def test_the_capacity_cases(clusters: list[ClusterSnapshot], count: int, expected: dict[str, int] | None) -> None:
    assert schedule(PlacementRequest("ns", SLICE, count), clusters).placement == expected


def test_pack_uses_the_fewest_clusters_and_spread_balances() -> None:
    clusters = [cluster("r1", "1"), cluster("r2"), cluster("r3")]
    assert schedule(PlacementRequest("ns", SLICE, 3, policy="pack"), clusters).placement == {"r1": 3}
    # spread: every cluster ends with the same room left (2 slices each)
    assert schedule(PlacementRequest("ns", SLICE, 3, policy="spread"), clusters).placement == {"r1": 1, "r2": 1, "r3": 1}


def test_a_full_cluster_says_why_it_was_not_used() -> None:
    result = schedule(PlacementRequest("ns", SLICE, 3), [cluster("r1", "4"), cluster("r2", "3"), cluster("r3", health="Unreachable")])
    assert result.placement is None
    assert result.diagnosis["r3"].startswith("Unreachable")
    assert result.diagnosis["r1"].startswith("InsufficientCapacity: room for 0")
    assert result.diagnosis["r2"].startswith("InsufficientCapacity: room for 1")


def test_every_cluster_left_out_keeps_one_closed_reason_code_with_its_message() -> None:
    result = schedule(PlacementRequest("ns", SLICE, 1, previous={"gone": 1}),
                      [cluster("r1"), cluster("r2"), cluster("r3", health="Unreachable")])  # fmt: skip
    assert result.placement == {"r1": 1}
    assert {name: r.code for name, r in result.rejections.items()} == {"r2": "NotNeeded", "r3": "Unreachable",
                                                                        "gone": "Unknown"}  # fmt: skip
    assert result.diagnosis["r3"] == f"Unreachable: {result.rejections['r3'].message}"


def test_headroom_is_kept_free() -> None:
    clusters = [cluster("r1", headroom={"cpu": "1", "memory": "2Gi"})]
    assert schedule(PlacementRequest("ns", SLICE, 2), clusters).placement == {"r1": 2}
    assert schedule(PlacementRequest("ns", SLICE, 3), clusters).placement is None


@pytest.mark.parametrize(
    ("percent", "reserved", "expected"),
    [
        pytest.param(0, {}, {"cpu": "0", "memory": "0"}, id="0 percent keeps nothing free"),
        pytest.param(25, {}, {"cpu": "500m", "memory": "1Gi"}, id="25 percent of 2 cpu and 4Gi"),
        pytest.param(25, {"cpu": "1"}, {"cpu": "1500m", "memory": "1Gi"}, id="the SuperCluster's headroom adds to it"),
        pytest.param(33, {}, {"cpu": "660m", "memory": "1351Mi"}, id="rounded down to a milli-CPU and a Mi"),
    ],
)  # fmt: skip
def test_headroom_percent_of_the_allocatable_is_added_to_the_super_clusters_headroom(
        percent: int, reserved: dict[str, str], expected: dict[str, str]) -> None:  # fmt: skip
    kept = headroom(allocatable=Resources(cpu="2", memory="4Gi"), reserved=Resources(reserved), percent=percent)
    assert kept == Resources(expected)


def test_headroom_percent_leaves_fewer_slices_to_place() -> None:
    kept = headroom(allocatable=Resources(cpu="2", memory="4Gi"), reserved=Resources(), percent=50)
    clusters = [cluster("r1", headroom=kept.to_kubernetes())]
    assert schedule(PlacementRequest("ns", SLICE, 2), clusters).placement == {"r1": 2}
    assert schedule(PlacementRequest("ns", SLICE, 3), clusters).placement is None


@pytest.mark.parametrize(
    ("policy", "clusters", "count", "expected"),
    [
        pytest.param("pack", ["0", "0", "0"], 4, {"r1": 4}, id="pack: an empty pool fills the first cluster"),
        pytest.param("spread", ["0", "0", "0"], 4, {"r1": 2, "r2": 1, "r3": 1}, id="spread: an empty pool balances"),
        pytest.param("pack", ["2", "0", "1"], 2, {"r1": 2}, id="pack: the fullest cluster that holds them"),
        pytest.param("spread", ["2", "0", "1"], 2, {"r2": 1, "r3": 1}, id="spread: the roomiest clusters, balanced"),
        pytest.param("pack", ["3", "0", "0"], 3, {"r1": 1, "r2": 2}, id="pack: the rest on as few clusters as fit"),
        pytest.param("spread", ["3", "0", "0"], 3, {"r2": 2, "r3": 1}, id="spread: the rest balanced"),
    ],
)  # fmt: skip
def test_pack_and_spread_vectors(policy: Policy, clusters: list[str], count: int, expected: dict[str, int]) -> None:
    snapshot = [cluster(f"r{i}", placed) for i, placed in enumerate(clusters, start=1)]
    assert schedule(PlacementRequest("ns", SLICE, count, policy=policy), snapshot).placement == expected


@pytest.mark.parametrize(
    ("health", "request_", "expected", "code"),
    [
        pytest.param("Suspect", PlacementRequest("ns", SLICE, 2), {"r2": 2}, "Suspect",
                     id="a Suspect cluster takes no new slices"),
        pytest.param("Unknown", PlacementRequest("ns", SLICE, 2), {"r2": 2}, "NotProbed",
                     id="a cluster not probed yet takes no new slices"),
        pytest.param("Suspect", PlacementRequest("ns", SLICE, 2, previous={"r1": 2}), {"r1": 2}, "Suspect",
                     id="a blip moves nothing: a Suspect cluster keeps its slices"),
        pytest.param("Unknown", PlacementRequest("ns", SLICE, 3, previous={"r1": 2}), {"r1": 2, "r2": 1}, "NotProbed",
                     id="an unprobed cluster keeps its slices unchecked; a grown quota goes elsewhere"),
        pytest.param("Unreachable", PlacementRequest("ns", SLICE, 2, previous={"r1": 2}), {"r2": 2}, "Unreachable",
                     id="an Unreachable cluster's slices move"),
        pytest.param("Suspect", PlacementRequest("ns", SLICE, 2, mandatory={"r1": 2}), {"r1": 2}, "Suspect",
                     id="a mandatory entry on a Suspect cluster is kept"),
    ],
)  # fmt: skip
def test_health_decides_which_clusters_take_keep_or_drain_slices(health: HealthState, request_: PlacementRequest,
                                                                 expected: dict[str, int], code: str) -> None:  # fmt: skip
    # r1 has no allocatable recorded (never probed, or failing since before): only a Ready one is checked.
    result = schedule(request_, [cluster("r1", health=health, cpu="0", memory="0"), cluster("r2")])
    assert result.placement == expected
    assert result.rejections["r1"].code == code


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        pytest.param(PlacementRequest("ns", SLICE, 4, previous={"r1": 2}), {"r1": 2, "r2": 1, "r3": 1},
                     id="a grown quota keeps what is placed and adds"),
        pytest.param(PlacementRequest("ns", SLICE, 1, previous={"r1": 1, "r2": 1}), {"r2": 1},
                     id="a shrunk quota gives back slices"),
        pytest.param(PlacementRequest("ns", SLICE, 2, mandatory={"r3": 5}), {"r3": 2},
                     id="a user-edited placement is kept, capped to the slice count"),
        pytest.param(PlacementRequest("ns", SLICE, 2), {"r2": 1, "r3": 1}, id="a cleared placement is scheduled afresh"),
        pytest.param(PlacementRequest("ns", SLICE, 2, previous={"gone": 2}), {"r2": 1, "r3": 1},
                     id="slices of a removed cluster move elsewhere"),
    ],
)  # fmt: skip
def test_rescheduling(request_: PlacementRequest, expected: dict[str, int]) -> None:
    assert schedule(request_, [cluster("r1", "1"), cluster("r2"), cluster("r3")]).placement == expected


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=6), min_size=100, max_size=100), st.sampled_from(["spread", "pack"]))
def test_a_hundred_namespaces_placed_one_after_another_never_overcommit(counts: list[int], policy: str) -> None:
    clusters = {n: cluster(n, cpu="16", memory="32Gi", headroom={"cpu": "1", "memory": "2Gi"}) for n in ("a", "b", "c")}
    for i, count in enumerate(counts):
        result = schedule(PlacementRequest(f"ns{i}", SLICE, count, policy=policy), list(clusters.values()))  # type: ignore[arg-type]
        for name, n in (result.placement or {}).items():
            c = clusters[name]
            clusters[name] = ClusterSnapshot(c.name, c.health, c.allocatable, c.headroom,
                                             c.placed + Resources(cpu=f"{n * 500}m", memory=f"{n}Gi"))  # fmt: skip
    for c in clusters.values():
        assert c.placed.fits_in(c.capacity)


def test_virtualclusters_per_slice_first_fit_places_every_slice_or_none() -> None:
    clusters = [cluster("r1", "1"), cluster("r2"), cluster("r3", health="Unreachable")]  # room for 3 and 4 slices
    placed = first_fit_slices(SLICE, 7, clusters, random.Random(1))
    assert placed == {"r1": 3, "r2": 4}
    assert first_fit_slices(SLICE, 8, clusters, random.Random(1)) is None  # all or nothing


def test_whole_quota_first_fit_is_the_baseline_slices_beat() -> None:
    clusters = [cluster("r1", "3"), cluster("r2", "3")]
    assert first_fit_whole_quota(Resources(cpu="1", memory="2Gi"), clusters) is None  # 2 slices fit only split
    assert schedule(PlacementRequest("ns", SLICE, 2), clusters).placement == {"r1": 1, "r2": 1}


@pytest.mark.parametrize(
    ("requests", "used", "expected"),
    [
        pytest.param({"cpu": "400m"}, {}, "r1", id="an empty namespace takes the first cluster with room"),
        pytest.param({"cpu": "400m"}, {"r1": {"cpu": "900m"}}, "r2", id="the cluster with more room wins"),
        pytest.param({"cpu": "2"}, {}, None, id="a pod bigger than any share fits nowhere"),
    ],
)
def test_pod_placement(requests: dict[str, str], used: dict[str, dict[str, str]], expected: str | None) -> None:
    result = choose_cluster(requests=Resources(requests), placement={"r1": 2, "r2": 1}, slice_=SLICE,
                            used={k: Resources(v) for k, v in used.items()})  # fmt: skip
    assert result.cluster == expected
    if expected is None:
        assert all(r.startswith("InsufficientQuota") for r in result.reasons.values())


@given(st.lists(st.integers(min_value=1, max_value=1500), max_size=30),
       st.dictionaries(st.sampled_from(["s1", "s2", "s3"]), st.integers(min_value=1, max_value=3), min_size=1),
       st.dictionaries(st.sampled_from(["s1", "s2", "s3"]), st.integers(min_value=0, max_value=2000)))  # fmt: skip
def test_waiting_pods_never_get_more_than_the_slices_hold_and_one_that_fits_is_never_left(
    millicores: list[int], placement: dict[str, int], used_milli: dict[str, int]
) -> None:
    """place_waiting, the one rule of the pass and the pod placer: per cluster, what is used plus what is
    placed stays within the slices there (when it started within); a pod is left only when it fits nowhere."""
    slice_ = Resources({"cpu": 1})
    used = {c: Resources({"cpu": Decimal(m) / 1000}) for c, m in used_milli.items()}
    pods = [WaitingPod(f"p{i}", Resources({"cpu": Decimal(m) / 1000})) for i, m in enumerate(millicores)]
    chosen = place_waiting(pods, placement=placement, slice_=slice_, used=used)
    total = {c: used.get(c, Resources()).get("cpu", 0) for c in placement}
    for pod in pods:
        room = {c: placement[c] - total[c] for c in placement}
        cluster = chosen[pod.name].cluster
        if cluster is None:
            assert all(pod.requests["cpu"] > r for r in room.values())
        else:
            assert pod.requests["cpu"] <= room[cluster]
            total[cluster] += pod.requests["cpu"]
